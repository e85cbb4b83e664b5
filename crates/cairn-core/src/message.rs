//! The neutral message model: what a session stores and every provider
//! adapter converts to and from its own wire shape.
//!
//! It must stay independent of any one API (OpenAI Chat Completions,
//! Responses, Anthropic Messages), so that switching provider between turns
//! of one session works. Provider-specific data that must be passed back
//! verbatim (reasoning signatures, encrypted reasoning) is kept opaque in
//! [`ContentPart::Reasoning`], tagged with the provider kind that produced it.

use serde::{Deserialize, Serialize};
use serde_json::Value;

/// Who speaks a message.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum Role {
    /// Instructions from the host (system prompt).
    System,
    /// The person (or embedding program) driving the agent.
    User,
    /// The model.
    Assistant,
    /// Results of tool calls, fed back to the model.
    Tool,
}

/// One message of the conversation.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Message {
    /// Who speaks.
    pub role: Role,
    /// Ordered parts (text, tool calls, tool results, reasoning).
    pub content: Vec<ContentPart>,
}

impl Message {
    /// A message with a single text part.
    pub fn text(role: Role, text: impl Into<String>) -> Self {
        Self { role, content: vec![ContentPart::Text { text: text.into() }] }
    }

    /// The concatenated text parts of this message.
    pub fn joined_text(&self) -> String {
        let mut out = String::new();
        for part in &self.content {
            if let ContentPart::Text { text } = part {
                out.push_str(text);
            }
        }
        out
    }

    /// The tool calls this message asks for, in order.
    pub fn tool_calls(&self) -> impl Iterator<Item = &ToolCall> {
        self.content.iter().filter_map(|part| match part {
            ContentPart::ToolCall(call) => Some(call),
            _ => None,
        })
    }

    /// The first tool-call id this message uses for more than one call.
    pub fn duplicate_tool_call_id(&self) -> Option<&str> {
        let mut seen = std::collections::HashSet::new();
        self.tool_calls().map(|c| c.id.as_str()).find(|id| !seen.insert(*id))
    }
}

/// A call the model asks cairn to make.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ToolCall {
    /// The provider's id for the call; tool results refer to it.
    pub id: String,
    /// The tool's name as offered to the model.
    pub name: String,
    /// The arguments. Kept as the JSON the model produced; when the model's
    /// text was not valid JSON the raw text is kept as a JSON string so the
    /// turn can reject it with a reason instead of losing it.
    pub arguments: Value,
}

/// One part of a message.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "camelCase")]
pub enum ContentPart {
    /// Plain text.
    Text {
        /// The text.
        text: String,
    },
    /// A tool call requested by the assistant.
    ToolCall(ToolCall),
    /// The result of a tool call, sent back to the model.
    #[serde(rename_all = "camelCase")]
    ToolResult {
        /// The id of the call this answers.
        call_id: String,
        /// What the model sees (possibly truncated, with a marker).
        content: String,
        /// Whether the call failed or was rejected.
        is_error: bool,
    },
    /// An image the person gave with the prompt, whole, base64-encoded
    /// (checked by [`image`]: a known type, valid base64, within
    /// [`MAX_PROMPT_IMAGE_BYTES`]). Sent only to a provider that takes
    /// images (`Provider::accepts_images`).
    #[serde(rename_all = "camelCase")]
    Image {
        /// `image/png`, `image/jpeg`, `image/gif` or `image/webp`.
        mime_type: String,
        /// The image's bytes in standard base64 (with padding).
        data: String,
    },
    /// Model reasoning. `text` is the readable summary (may be empty);
    /// `opaque` is provider data passed back verbatim (an Anthropic thinking
    /// signature, an OpenAI encrypted reasoning item) and only to a provider
    /// of the same `provider` kind.
    Reasoning {
        /// Readable reasoning text or summary.
        text: String,
        /// The provider kind that produced `opaque` (e.g. "anthropic").
        provider: String,
        /// Opaque provider data for pass-back.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        opaque: Option<Value>,
    },
}

/// The image types a prompt may carry: those every image-taking API cairn
/// speaks accepts (OpenAI, Anthropic).
pub const IMAGE_TYPES: [&str; 4] = ["image/png", "image/jpeg", "image/gif", "image/webp"];

/// The most base64 text the images of one prompt may hold together (8 MiB,
/// about 6 MiB of images): the prompt's line stays far below the session
/// file's line limit, so the session stays readable, and below what the
/// faces' transports carry.
pub const MAX_PROMPT_IMAGE_BYTES: usize = 8 * 1024 * 1024;

/// Why an image was refused; each message says what to do.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ImageError {
    /// Not one of [`IMAGE_TYPES`].
    #[error("images of type {0:?} are not taken: send PNG, JPEG, GIF or WebP")]
    Type(String),
    /// The data is not standard base64.
    #[error("the image's data is not valid base64 (standard alphabet, padded): {0}")]
    Base64(String),
    /// The prompt's images are too large together.
    #[error(
        "the prompt's images hold {0} bytes of base64, over the limit of {MAX_PROMPT_IMAGE_BYTES}: send fewer or smaller images"
    )]
    TooLarge(usize),
}

/// An image part from a MIME type and base64 data, checked (whitespace in
/// the data is dropped). `so_far`: base64 bytes of the prompt's earlier
/// images, counted against [`MAX_PROMPT_IMAGE_BYTES`].
pub fn image(mime_type: &str, data: &str, so_far: usize) -> Result<ContentPart, ImageError> {
    let mime = mime_type.trim().to_ascii_lowercase();
    if !IMAGE_TYPES.contains(&mime.as_str()) {
        return Err(ImageError::Type(mime_type.to_owned()));
    }
    let data: String = data.chars().filter(|c| !c.is_ascii_whitespace()).collect();
    let total = so_far.saturating_add(data.len());
    if total > MAX_PROMPT_IMAGE_BYTES {
        return Err(ImageError::TooLarge(total));
    }
    check_base64(&data).map_err(ImageError::Base64)?;
    Ok(ContentPart::Image { mime_type: mime, data })
}

/// Whether `data` is standard, padded base64 of at least one byte.
fn check_base64(data: &str) -> Result<(), String> {
    if data.is_empty() {
        return Err("it is empty".to_owned());
    }
    if !data.len().is_multiple_of(4) {
        return Err(format!("its length {} is not a multiple of 4", data.len()));
    }
    let body = data.trim_end_matches('=');
    if data.len() - body.len() > 2 {
        return Err("it ends with more than two '='".to_owned());
    }
    match body.bytes().position(|b| !(b.is_ascii_alphanumeric() || b == b'+' || b == b'/')) {
        Some(at) => Err(format!("byte {at} is not in the base64 alphabet")),
        None => Ok(()),
    }
}

#[cfg(test)]
mod image_tests {
    use super::*;

    #[test]
    fn images_are_checked_for_type_base64_and_size() {
        assert_eq!(
            image("IMAGE/PNG", "iVBO\nRw==", 0),
            Ok(ContentPart::Image { mime_type: "image/png".into(), data: "iVBORw==".into() })
        );
        assert!(matches!(image("image/bmp", "AAAA", 0), Err(ImageError::Type(_))));
        for bad in ["", "AAA", "AA-A", "A===", "AAAA====x"] {
            assert!(matches!(image("image/png", bad, 0), Err(ImageError::Base64(_))), "{bad:?}");
        }
        assert!(matches!(image("image/png", "AAAA", MAX_PROMPT_IMAGE_BYTES - 3), Err(ImageError::TooLarge(_))));
        let json = serde_json::to_value(ContentPart::Image { mime_type: "image/png".into(), data: "AAAA".into() });
        assert_eq!(json.ok(), Some(serde_json::json!({"type": "image", "mimeType": "image/png", "data": "AAAA"})));
    }
}
