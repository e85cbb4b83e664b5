//! The tokenizer, rebuilt from the GGUF metadata, and the byte table of every
//! token.
//!
//! The GGUF holds a gpt2-style byte-level BPE (`tokenizer.ggml.model=gpt2`,
//! pre-tokenizer `smollm`): 49,152 tokens, 48,900 merges and 17 control
//! tokens. It is rebuilt with the `tokenizers` BPE builder and the same
//! pipeline as the original `tokenizer.json`: digits split one by one, then
//! byte-level (no prefix space). Control tokens are registered as special
//! added tokens so ChatML markers in a prompt encode to their ids.
//!
//! This module must not know about chat formats or generation; it maps text
//! to ids and ids to bytes.

use std::collections::HashMap;

use candle_core::quantized::gguf_file;
use tokenizers::decoders::byte_level::ByteLevel as ByteLevelDecoder;
use tokenizers::models::bpe::{BPE, Vocab};
use tokenizers::pre_tokenizers::byte_level::ByteLevel;
use tokenizers::pre_tokenizers::digits::Digits;
use tokenizers::pre_tokenizers::sequence::Sequence;
use tokenizers::{AddedToken, PreTokenizerWrapper, Tokenizer};

use crate::LocalError;

/// GGUF token type of a control token.
const TOKEN_TYPE_CONTROL: i32 = 3;

/// The tokenizer plus what generation needs to know about each token.
#[derive(Debug)]
pub struct LocalTokenizer {
    inner: Tokenizer,
    /// The raw bytes each token stands for (empty for control tokens).
    bytes: Vec<Vec<u8>>,
    /// Whether each token is a control token.
    control: Vec<bool>,
    /// `<|im_start|>`.
    pub im_start: u32,
    /// `<|im_end|>` (end of turn).
    pub im_end: u32,
    /// `<|endoftext|>`.
    pub end_of_text: u32,
}

fn md<'a>(ct: &'a gguf_file::Content, key: &str) -> Result<&'a gguf_file::Value, LocalError> {
    ct.metadata.get(key).ok_or_else(|| LocalError::Tokenizer(format!("metadata key {key} missing")))
}

fn str_array(ct: &gguf_file::Content, key: &str) -> Result<Vec<String>, LocalError> {
    let values = md(ct, key)?.to_vec().map_err(|e| LocalError::Tokenizer(format!("{key}: {e}")))?;
    values.iter().map(|v| v.to_string().cloned().map_err(|e| LocalError::Tokenizer(format!("{key}: {e}")))).collect()
}

/// GPT-2's byte ↔ printable-char table (inverse direction: char → byte).
fn byte_level_table() -> HashMap<char, u8> {
    let mut printable: Vec<u32> = (u32::from('!')..=u32::from('~')).collect();
    printable.extend(0xA1..=0xAC);
    printable.extend(0xAE..=0xFF);
    let mut table = HashMap::new();
    let mut extra = 0u32;
    for b in 0u32..256 {
        let ch = if printable.contains(&b) {
            b
        } else {
            extra += 1;
            255 + extra
        };
        if let (Some(c), Ok(byte)) = (char::from_u32(ch), u8::try_from(b)) {
            table.insert(c, byte);
        }
    }
    table
}

impl LocalTokenizer {
    /// Build the tokenizer from a GGUF file's metadata.
    pub fn from_gguf(ct: &gguf_file::Content) -> Result<Self, LocalError> {
        let model = md(ct, "tokenizer.ggml.model")?.to_string().map_err(|e| LocalError::Tokenizer(e.to_string()))?;
        if model != "gpt2" {
            return Err(LocalError::Tokenizer(format!("tokenizer model {model:?} is not supported (only gpt2 BPE)")));
        }
        let tokens = str_array(ct, "tokenizer.ggml.tokens")?;
        let merges = str_array(ct, "tokenizer.ggml.merges")?;
        let types: Vec<i32> = md(ct, "tokenizer.ggml.token_type")?
            .to_vec()
            .map_err(|e| LocalError::Tokenizer(e.to_string()))?
            .iter()
            .map(|v| v.to_i32().unwrap_or(1))
            .collect();
        if types.len() != tokens.len() {
            return Err(LocalError::Tokenizer("token_type and tokens differ in length".into()));
        }
        let vocab: Vocab = tokens.iter().enumerate().map(|(i, t)| (t.clone(), i as u32)).collect();
        let merges = merges
            .iter()
            .map(|m| {
                m.split_once(' ')
                    .map(|(a, b)| (a.to_string(), b.to_string()))
                    .ok_or_else(|| LocalError::Tokenizer(format!("malformed merge {m:?}")))
            })
            .collect::<Result<Vec<_>, _>>()?;
        let bpe =
            BPE::builder().vocab_and_merges(vocab, merges).build().map_err(|e| LocalError::Tokenizer(e.to_string()))?;
        let mut inner = Tokenizer::new(bpe);
        let pre: Vec<PreTokenizerWrapper> = vec![Digits::new(true).into(), ByteLevel::new(false, true, true).into()];
        inner.with_pre_tokenizer(Some(Sequence::new(pre)));
        inner.with_decoder(Some(ByteLevelDecoder::default()));
        let control: Vec<bool> = types.iter().map(|&t| t == TOKEN_TYPE_CONTROL).collect();
        let specials: Vec<AddedToken> =
            tokens.iter().zip(&control).filter(|(_, c)| **c).map(|(t, _)| AddedToken::from(t.clone(), true)).collect();
        inner.add_special_tokens(specials).map_err(|e| LocalError::Tokenizer(e.to_string()))?;

        let table = byte_level_table();
        let bytes = tokens
            .iter()
            .zip(&control)
            .map(|(t, c)| if *c { Vec::new() } else { t.chars().filter_map(|ch| table.get(&ch).copied()).collect() })
            .collect();
        let id = |name: &str| {
            tokens
                .iter()
                .position(|t| t == name)
                .map(|i| i as u32)
                .ok_or_else(|| LocalError::Tokenizer(format!("control token {name} missing")))
        };
        Ok(Self {
            im_start: id("<|im_start|>")?,
            im_end: id("<|im_end|>")?,
            end_of_text: id("<|endoftext|>")?,
            inner,
            bytes,
            control,
        })
    }

    /// Encode text; ChatML markers in it become their control-token ids.
    pub fn encode(&self, text: &str) -> Result<Vec<u32>, LocalError> {
        let enc = self.inner.encode(text, false).map_err(|e| LocalError::Tokenizer(e.to_string()))?;
        Ok(enc.get_ids().to_vec())
    }

    /// Decode ids to text (control tokens included as their markers).
    pub fn decode(&self, ids: &[u32]) -> Result<String, LocalError> {
        self.inner.decode(ids, false).map_err(|e| LocalError::Tokenizer(e.to_string()))
    }

    /// Number of tokens in the vocabulary.
    pub fn vocab_size(&self) -> usize {
        self.bytes.len()
    }

    /// The raw bytes of a token (empty for control tokens).
    pub fn token_bytes(&self, id: u32) -> &[u8] {
        self.bytes.get(id as usize).map(Vec::as_slice).unwrap_or_default()
    }

    /// Whether a token is a control token.
    pub fn is_control(&self, id: u32) -> bool {
        self.control.get(id as usize).copied().unwrap_or(false)
    }

    /// The id of a token given its vocabulary string, if any.
    pub fn token_id(&self, token: &str) -> Option<u32> {
        self.inner.token_to_id(token)
    }

    pub(crate) fn all_bytes(&self) -> &[Vec<u8>] {
        &self.bytes
    }
}
