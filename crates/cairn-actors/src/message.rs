//! Message formats between the broker and actors, actor id rules and message
//! id assignment. Pure data: owns no threads, files or WASM.
//!
//! Stdin line (broker → actor): `{"id","from","reply_to"?,"body"}`.
//! Stdout line (actor → broker): `{"to"?,"id"?,"reply_to"?,"body"}`.

use serde::{Deserialize, Serialize};
use serde_json::Value;

/// Ids reserved for native (host) participants. `broker` answers requests,
/// `console` is the human/script at the terminal.
pub const BROKER: &str = "broker";
/// The console participant.
pub const CONSOLE: &str = "console";
/// The agent's fixed id: a native participant (see `World::send_as`).
pub const AGENT: &str = "agent";
/// The native compiler participant (`cc`: builds C into actors).
pub const CC: &str = "cc";
/// The native HTTP participant (`http`: outgoing requests for the actors
/// that declared them).
pub const HTTP: &str = "http";

/// The largest message, in bytes of its line (an actor's stdout line, or
/// the stdin line the broker queues): 1 MiB. A longer stdout line ends
/// the actor as a crash (`runtime`); a longer message is refused at its
/// mailbox (`undeliverable`).
pub const MESSAGE_LIMIT: usize = 1 << 20;

/// A line written to an actor's stdin.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Inbound {
    /// Message id: `<sender>/<own id>` or `m-<n>`.
    pub id: String,
    /// Set by the broker, never by the sender.
    pub from: String,
    /// The id of the message this one answers.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reply_to: Option<String>,
    /// Free JSON chosen by the sender.
    pub body: Value,
}

/// A line an actor wrote to stdout, once validated.
#[derive(Debug, Clone, PartialEq)]
pub struct Outbound {
    /// Recipient; `None` means the sender's subscribers.
    pub to: Option<String>,
    /// The sender's own id for the message (prefixed by the broker).
    pub id: Option<String>,
    /// The id of the message this one answers.
    pub reply_to: Option<String>,
    /// Free JSON.
    pub body: Value,
}

/// Why a stdout line is not a message (the note written to `stderr.log`).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum LineError {
    /// Not JSON at all.
    #[error("stdout line is not JSON ({0}); expected {{\"to\"?,\"id\"?,\"reply_to\"?,\"body\"}}")]
    NotJson(String),
    /// JSON but not an object.
    #[error("stdout line is JSON but not an object; expected {{\"to\"?,\"id\"?,\"reply_to\"?,\"body\"}}")]
    NotObject,
    /// An object without `body`.
    #[error("stdout line has no \"body\"; every message needs one")]
    NoBody,
    /// `to`, `id` or `reply_to` is not a string.
    #[error("stdout line field \"{0}\" must be a string")]
    FieldNotString(&'static str),
}

impl Outbound {
    /// Parses one stdout line. Extra fields are ignored (a sender cannot set
    /// `from`: the broker does).
    pub fn parse(line: &str) -> Result<Outbound, LineError> {
        let v: Value = serde_json::from_str(line).map_err(|e| LineError::NotJson(e.to_string()))?;
        let Value::Object(mut map) = v else {
            return Err(LineError::NotObject);
        };
        let body = map.remove("body").ok_or(LineError::NoBody)?;
        let mut field = |name: &'static str| -> Result<Option<String>, LineError> {
            match map.remove(name) {
                None | Some(Value::Null) => Ok(None),
                Some(Value::String(s)) => Ok(Some(s)),
                Some(_) => Err(LineError::FieldNotString(name)),
            }
        };
        Ok(Outbound { to: field("to")?, id: field("id")?, reply_to: field("reply_to")?, body })
    }
}

/// Why an actor id is refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum IdError {
    /// Empty or longer than 64 characters.
    #[error("actor id must be 1 to 64 characters, got {0}")]
    Length(usize),
    /// A character outside `a-z 0-9 - _`.
    #[error("actor id {0:?} may only contain a-z, 0-9, '-' and '_'")]
    Chars(String),
    /// A native participant's id.
    #[error("actor id {0:?} is reserved for the host")]
    Reserved(String),
}

/// Checks the actor id rules: `a-z 0-9 - _`, 1 to 64 characters, not a
/// reserved native id.
pub fn check_actor_id(id: &str) -> Result<(), IdError> {
    if id.is_empty() || id.len() > 64 {
        return Err(IdError::Length(id.chars().count()));
    }
    if !id.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-' || b == b'_') {
        return Err(IdError::Chars(id.to_owned()));
    }
    if id == BROKER || id == CONSOLE || id == AGENT || id == CC || id == HTTP {
        return Err(IdError::Reserved(id.to_owned()));
    }
    Ok(())
}

/// The broker-side id of a message: the sender's own id is prefixed with the
/// sender so ids cannot collide or be faked; otherwise `m-<n>`.
pub fn message_id(sender: &str, own: Option<&str>, counter: &mut u64) -> String {
    match own {
        Some(own) => format!("{sender}/{own}"),
        None => {
            *counter += 1;
            format!("m-{counter}")
        }
    }
}

/// The body of a routing error sent from `broker`.
pub fn undeliverable(reason: &str, to: &str) -> Value {
    serde_json::json!({"type": "undeliverable", "reason": reason, "to": to})
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids() {
        assert!(check_actor_id("echo-1_a").is_ok());
        assert!(check_actor_id(&"a".repeat(64)).is_ok());
        assert_eq!(check_actor_id(&"a".repeat(65)), Err(IdError::Length(65)));
        assert!(check_actor_id("").is_err());
        for bad in ["A", "a b", "a/b", "..", "é", "a.b", "broker", "console", "agent", "cc"] {
            assert!(check_actor_id(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn lines() {
        let m = Outbound::parse(r#"{"to":"b","id":"x","body":{"k":1},"from":"fake"}"#);
        assert_eq!(
            m,
            Ok(Outbound {
                to: Some("b".into()),
                id: Some("x".into()),
                reply_to: None,
                body: serde_json::json!({"k":1})
            })
        );
        assert!(matches!(Outbound::parse("hello"), Err(LineError::NotJson(_))));
        assert_eq!(Outbound::parse("[1]"), Err(LineError::NotObject));
        assert_eq!(Outbound::parse(r#"{"to":"b"}"#), Err(LineError::NoBody));
        assert_eq!(Outbound::parse(r#"{"to":3,"body":1}"#), Err(LineError::FieldNotString("to")));
        let mut n = 0;
        assert_eq!(message_id("a", Some("x"), &mut n), "a/x");
        assert_eq!(message_id("a", None, &mut n), "m-1");
        assert_eq!(message_id("a", None, &mut n), "m-2");
    }
}
