//! The neutral conversation → ChatML prompt, and a tool call parsed back.
//!
//! SmolLM2's chat template (in the GGUF metadata) is ChatML:
//! `<|im_start|>{role}\n{content}<|im_end|>\n` per message, then
//! `<|im_start|>assistant\n` for the answer, with a default system prompt
//! when the conversation has none. Offered tools are described in the system
//! prompt; the model's earlier tool calls are rendered as the JSON object the
//! grammar produces, and tool results as user turns (the template has no tool
//! role). When the prompt does not fit the context, whole old messages are
//! dropped (oldest first, never the last one), then the last message's text
//! is cut from its start, so a long session keeps working.
//!
//! This module must not touch the model; it works on strings and counts.

use std::collections::HashMap;
use std::fmt::Write as _;

use crate::focus::focus_line_cached;
use cairn_core::message::{ContentPart, Message, Role};
use cairn_core::tool::ToolSpec;
use serde_json::Value;

/// The system prompt of SmolLM2's chat template, used when the host gives none.
pub const DEFAULT_SYSTEM: &str = "You are a helpful AI assistant named SmolLM, trained by Hugging Face";

/// The system prompt: the host's (or the template's default) plus, when
/// tools are offered, their description and how to call them.
pub fn system_prompt(system: Option<&str>, tools: &[ToolSpec]) -> String {
    let mut out = system.filter(|s| !s.trim().is_empty()).unwrap_or(DEFAULT_SYSTEM).to_string();
    if tools.is_empty() {
        return out;
    }
    out.push_str("\n\nYou can call these tools:\n");
    for tool in tools {
        let _ = writeln!(
            out,
            "- {}: {} Arguments: {}",
            tool.name,
            tool.description.trim(),
            describe_args(&tool.input_schema)
        );
    }
    out.push_str(
        "When the user asks for something a tool can do, call the tool: answer with only a JSON object \
         {\"name\": \"<tool name>\", \"arguments\": {...}} and nothing else, taking the argument values \
         from the user's request. Answer in plain text only when no tool is needed.",
    );
    out
}

/// What the model is told about the session's working directory: where it
/// is and a short listing, as a person would look first. Appended to the
/// system prompt by the provider when it knows the directory.
pub fn workdir_note(dir: &std::path::Path, listing: &[String], more: bool) -> String {
    let mut out = format!("\n\nThe working directory is {}.", dir.display());
    if listing.is_empty() {
        out.push_str(" It is empty.");
    } else {
        out.push_str(" It contains: ");
        out.push_str(&listing.join(", "));
        out.push_str(if more { ", …" } else { "." });
    }
    out.push_str(" Paths are relative to it.");
    out
}

/// The tool and parameter of the example exchange: the first tool whose
/// required parameter is a grounded file path (`read_file` among the
/// built-ins).
fn example_tool(tools: &[ToolSpec]) -> Option<(&ToolSpec, &str)> {
    tools.iter().find_map(|t| {
        let required = t.input_schema.get("required")?.as_array()?;
        let props = t.input_schema.get("properties")?.as_object()?;
        let only = match required.as_slice() {
            [one] => one.as_str()?,
            _ => return None,
        };
        let p = props.get(only)?;
        (p.get("format").and_then(Value::as_str) == Some("path")
            && p.get("x-exists").and_then(Value::as_str) == Some("file"))
        .then_some((t, only))
    })
}

/// A compact, readable description of an arguments schema.
fn describe_args(schema: &Value) -> String {
    let Some(props) = schema.get("properties").and_then(Value::as_object) else {
        return "{}".to_string();
    };
    let required: Vec<&str> = schema
        .get("required")
        .and_then(Value::as_array)
        .map(|r| r.iter().filter_map(Value::as_str).collect())
        .unwrap_or_default();
    let parts: Vec<String> = props
        .iter()
        .map(|(k, v)| {
            let ty = v.get("type").map_or_else(|| "any".to_string(), |t| t.to_string().replace('"', ""));
            let opt = if required.contains(&k.as_str()) { "" } else { ", optional" };
            format!("\"{k}\": {ty}{opt}")
        })
        .collect();
    format!("{{{}}}", parts.join(", "))
}

/// One ChatML turn before rendering.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Turn {
    /// `system`, `user` or `assistant`.
    pub role: &'static str,
    /// The text of the turn.
    pub content: String,
}

impl Turn {
    /// Render the turn in ChatML.
    pub fn render(&self) -> String {
        format!("<|im_start|>{}\n{}<|im_end|>\n", self.role, self.content)
    }
}

/// The header that opens the model's answer.
pub const ASSISTANT_HEADER: &str = "<|im_start|>assistant\n";

/// Render a tool call the way the grammar lets the model write one.
pub fn render_call(name: &str, arguments: &Value) -> String {
    let call = serde_json::json!({"name": name, "arguments": arguments});
    // Keep "name" first as the grammar requires.
    format!(
        "{{\"name\": {}, \"arguments\": {}}}",
        serde_json::to_string(&call["name"]).unwrap_or_default(),
        serde_json::to_string(&call["arguments"]).unwrap_or_default()
    )
}

/// The text of a tool result as the model sees it (a user turn: the
/// template has no tool role).
/// `request` is the person's latest request, repeated right after the
/// result: a small model answers what it read last, and otherwise copies
/// the form (or the words) of an earlier answer.
fn result_text(name: &str, content: &str, is_error: bool, request: Option<&str>) -> String {
    let what = if is_error { "Error from" } else { "Result of" };
    let content = without_line_numbers(content);
    let content = content.as_str();
    match request.map(str::trim).filter(|r| !r.is_empty()) {
        Some(request) => {
            // The line that answers, when one stands out (`focus.rs`): the
            // model copies from it instead of from a neighbouring row.
            let pointer = if is_error { None } else { focus_line_cached(content, request) };
            // Before the request, not after it: the model then copied the
            // pointer's words instead of its value (measured, BENCHMARKS.md).
            let pointer =
                pointer.map(|line| format!("The line that matches your request: {line}\n\n")).unwrap_or_default();
            format!("{what} {name}:\n{content}\n\n{pointer}Use this result to answer my request: {request}")
        }
        None => format!("{what} {name}:\n{content}\n\nUse this result to answer my request."),
    }
}

/// A file shown with line numbers (`read_file`'s `{n:>6}\t{line}`, and its
/// `[… more lines …]` notes) without them: a small model takes the numbers
/// for values ("the price is 3" for the third line). Anything else is left
/// as it is.
fn without_line_numbers(content: &str) -> String {
    let numbered = |line: &str| {
        let t = line.trim_start_matches(' ');
        let digits = t.bytes().take_while(u8::is_ascii_digit).count();
        digits > 0 && t.as_bytes().get(digits) == Some(&b'\t')
    };
    let lines: Vec<&str> = content.lines().collect();
    let is_note = |l: &str| l.starts_with('[') && l.ends_with(']');
    if !lines.iter().any(|l| numbered(l)) || !lines.iter().all(|l| numbered(l) || is_note(l) || l.is_empty()) {
        return content.to_owned();
    }
    let mut out: Vec<&str> = lines
        .into_iter()
        .map(|line| if numbered(line) { line.split_once('\t').map_or(line, |(_, rest)| rest) } else { line })
        .collect();
    if content.ends_with('\n') {
        out.push("");
    }
    out.join("\n")
}

/// The example file's content, as `read_file` shows it.
const EXAMPLE_RESULT: &str = "     1\tIt is teal.";

/// A short example exchange shown before the conversation when tools are
/// offered: a small model copies the form of earlier turns far more readily
/// than it follows instructions. It shows the whole loop: a request naming
/// a file, the call, its result (in the exact form real results take) and
/// an answer that copies the value. Its file name must not be one the model
/// could copy into a real call: `example_name` is chosen by the caller to be
/// absent from the working tree, where grounding makes it impossible to
/// write (the former `hello.txt` example was copied into real calls). Empty
/// when no offered tool takes a grounded file path.
pub fn example_turns(tools: &[ToolSpec], example_name: &str) -> Vec<Turn> {
    let Some((tool, param)) = example_tool(tools) else { return Vec::new() };
    let mut args = serde_json::Map::new();
    args.insert(param.to_string(), Value::String(example_name.to_string()));
    let request = format!("Read {example_name} and tell me the colour.");
    vec![
        Turn { role: "user", content: request.clone() },
        Turn { role: "assistant", content: render_call(&tool.name, &Value::Object(args)) },
        // One line that shares no word with the request, so no pointer
        // (`focus.rs`): with a pointer here, or a second line, the model
        // copied the pointer's words or the other line into real answers
        // (measured, BENCHMARKS.md).
        Turn { role: "user", content: result_text(&tool.name, EXAMPLE_RESULT, false, Some(&request)) },
        // The bare value: a sentence frame ("The colour is …") was copied
        // into unrelated answers, and a `key = value` line into a wrong
        // `key = value` (measured, BENCHMARKS.md).
        Turn { role: "assistant", content: "teal".to_string() },
    ]
}

/// Turn the neutral conversation into ChatML turns (system first, then the
/// `examples`, then the messages).
pub fn to_turns(system: &str, examples: &[Turn], messages: &[Message]) -> Vec<Turn> {
    let mut turns = vec![Turn { role: "system", content: system.to_string() }];
    turns.extend(examples.iter().cloned());
    let mut names: HashMap<&str, &str> = HashMap::new();
    let mut request: Option<String> = None;
    for msg in messages {
        if msg.role == Role::User {
            let said = msg.joined_text();
            if !said.trim().is_empty() {
                request = Some(said);
            }
        }
        let mut text = String::new();
        let mut push = |t: &str| {
            if !text.is_empty() {
                text.push('\n');
            }
            text.push_str(t);
        };
        for part in &msg.content {
            match part {
                ContentPart::Text { text: t } => push(t),
                ContentPart::ToolCall(call) => {
                    names.insert(&call.id, &call.name);
                    push(&render_call(&call.name, &call.arguments));
                }
                ContentPart::ToolResult { call_id, content, is_error } => {
                    let name = names.get(call_id.as_str()).copied().unwrap_or("the tool");
                    push(&result_text(name, content, *is_error, request.as_deref()));
                }
                ContentPart::Reasoning { .. } | ContentPart::Image { .. } => {}
            }
        }
        let role = match msg.role {
            Role::System => {
                // A system message inside the conversation joins the system prompt.
                if let Some(first) = turns.first_mut() {
                    first.content.push_str("\n\n");
                    first.content.push_str(&text);
                }
                continue;
            }
            Role::User | Role::Tool => "user",
            Role::Assistant => "assistant",
        };
        // Consecutive turns of one role (e.g. a tool result after a user
        // message) are merged: ChatML models expect alternation.
        let n = turns.len();
        match turns.last_mut() {
            Some(last) if last.role == role && n > 1 => {
                last.content.push_str("\n\n");
                last.content.push_str(&text);
            }
            _ => turns.push(Turn { role, content: text }),
        }
    }
    turns
}

/// Render the turns as a prompt that fits `budget` tokens, as counted by
/// `count`. Drops the oldest non-system turns first (never the last), then
/// cuts the last turn's text from its start. Returns the prompt and how many
/// turns were dropped. Turns are counted one by one: each starts with a
/// control token, so the counts add up.
pub fn fit_prompt(turns: &[Turn], budget: usize, count: &mut dyn FnMut(&str) -> usize) -> (String, usize) {
    let render = |ts: &[Turn]| {
        let mut s: String = ts.iter().map(Turn::render).collect();
        s.push_str(ASSISTANT_HEADER);
        s
    };
    let Some((system, rest)) = turns.split_first() else { return (ASSISTANT_HEADER.to_string(), 0) };
    let fixed = count(&system.render()) + count(ASSISTANT_HEADER);
    let costs: Vec<usize> = rest.iter().map(|t| count(&t.render())).collect();
    let mut start = 0;
    let mut total: usize = fixed + costs.iter().sum::<usize>();
    while total > budget && start + 1 < rest.len() {
        total -= costs.get(start).copied().unwrap_or_default();
        start += 1;
    }
    let mut kept = vec![system.clone()];
    kept.extend(rest.iter().skip(start).cloned());
    if total <= budget {
        return (render(&kept), start);
    }
    // Only the last turn is left and it is too long: keep its tail, halving
    // until it fits.
    let full = rest.last().map(|t| t.content.clone()).unwrap_or_default();
    let mut keep_chars = full.chars().count();
    loop {
        keep_chars /= 2;
        let skip = full.chars().count().saturating_sub(keep_chars);
        if let Some(last) = kept.last_mut() {
            last.content = format!("[…] {}", full.chars().skip(skip).collect::<String>());
        }
        let prompt = render(&kept);
        if count(&prompt) <= budget || keep_chars == 0 {
            return (prompt, start);
        }
    }
}

#[cfg(test)]
mod line_number_tests {
    use super::without_line_numbers;

    #[test]
    fn numbered_files_lose_their_numbers_and_nothing_else_changes() {
        assert_eq!(without_line_numbers("     1\titem,price\n     2\tcherry,12\n"), "item,price\ncherry,12\n");
        assert_eq!(
            without_line_numbers("     1\ta\t b\n[3 more lines; read on with offset=2]\n"),
            "a\t b\n[3 more lines; read on with offset=2]\n"
        );
        for kept in ["plain text\n", "12\tx\nnot numbered\n", "[empty file]\n", "", "x  1\ty\n"] {
            assert_eq!(without_line_numbers(kept), kept, "{kept:?}");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use cairn_core::message::ToolCall;
    use serde_json::json;

    #[test]
    fn renders_chatml_with_default_system() {
        let msgs = vec![Message::text(Role::User, "What is the capital of France?")];
        let turns = to_turns(&system_prompt(None, &[]), &[], &msgs);
        let (prompt, dropped) = fit_prompt(&turns, 1000, &mut |s| s.len());
        assert_eq!(dropped, 0);
        assert_eq!(
            prompt,
            "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n\
             <|im_start|>user\nWhat is the capital of France?<|im_end|>\n<|im_start|>assistant\n"
        );
    }

    #[test]
    fn renders_tool_calls_and_results() {
        let msgs = vec![
            Message::text(Role::User, "show main"),
            Message {
                role: Role::Assistant,
                content: vec![ContentPart::ToolCall(ToolCall {
                    id: "c1".into(),
                    name: "read_file".into(),
                    arguments: json!({"path": "main.rs"}),
                })],
            },
            Message {
                role: Role::Tool,
                content: vec![ContentPart::ToolResult {
                    call_id: "c1".into(),
                    content: "fn main() {}".into(),
                    is_error: false,
                }],
            },
        ];
        let turns = to_turns("sys", &[], &msgs);
        assert_eq!(turns.len(), 4);
        assert_eq!(turns[2].content, r#"{"name": "read_file", "arguments": {"path":"main.rs"}}"#);
        assert_eq!(
            turns[3],
            Turn {
                role: "user",
                content: "Result of read_file:\nfn main() {}\n\nThe line that matches your request: fn main() {}\n\n\
                          Use this result to answer my request: show main"
                    .into()
            }
        );
    }

    #[test]
    fn trims_old_turns_then_the_last_one() {
        let msgs: Vec<Message> =
            (0..10).map(|i| Message::text(Role::User, format!("message {i} {}", "x".repeat(50)))).collect();
        let turns = to_turns("sys", &[], &msgs);
        // Merged into one user turn (same role): make them alternate instead.
        assert_eq!(turns.len(), 2);
        let alternating: Vec<Message> = (0..10)
            .map(|i| {
                Message::text(if i % 2 == 0 { Role::User } else { Role::Assistant }, format!("m{i} {}", "x".repeat(50)))
            })
            .collect();
        let turns = to_turns("sys", &[], &alternating);
        let (prompt, dropped) = fit_prompt(&turns, 300, &mut |s| s.len());
        assert!(prompt.len() <= 300, "{}", prompt.len());
        assert!(dropped > 0);
        assert!(prompt.contains("m9"), "the last message stays");
        assert!(prompt.starts_with("<|im_start|>system\nsys"));
        let (prompt, _) = fit_prompt(&turns, 120, &mut |s| s.len());
        assert!(prompt.len() <= 120, "{prompt}");
        assert!(prompt.contains("[…]"));
    }

    #[test]
    fn the_example_names_only_the_given_file_and_shows_results_as_real_ones() {
        let spec = |schema: Value| ToolSpec {
            name: "read_file".into(),
            description: "Read a file.".into(),
            input_schema: schema,
            risk: cairn_core::tool::Risk::ReadOnly,
            capabilities: Default::default(),
            replay: cairn_core::tool::ReplayPolicy::Idempotent,
        };
        let grounded = spec(json!({"type": "object", "properties": {
            "path": {"type": "string", "format": "path", "x-exists": "file"}}, "required": ["path"]}));
        let ex = example_turns(std::slice::from_ref(&grounded), "example-0.txt");
        assert_eq!(ex.len(), 4);
        assert_eq!(ex[1].content, r#"{"name": "read_file", "arguments": {"path":"example-0.txt"}}"#);
        assert!(ex.iter().all(|t| !t.content.contains("hello")));
        // The result turn has exactly the form a real result gets.
        let msgs = vec![
            Message::text(Role::User, "Read example-0.txt and tell me the colour."),
            Message {
                role: Role::Assistant,
                content: vec![ContentPart::ToolCall(ToolCall {
                    id: "c".into(),
                    name: "read_file".into(),
                    arguments: json!({"path": "example-0.txt"}),
                })],
            },
            Message {
                role: Role::Tool,
                content: vec![ContentPart::ToolResult {
                    call_id: "c".into(),
                    content: EXAMPLE_RESULT.into(),
                    is_error: false,
                }],
            },
        ];
        assert_eq!(to_turns("s", &[], &msgs)[3], ex[2]);
        // Without line numbers, and without a pointer.
        assert_eq!(ex[2].content.matches("teal").count(), 1, "shown once, without its line number: {ex:?}");
        assert!(!ex[2].content.contains("1\t") && !ex[2].content.contains("The line that matches"), "{ex:?}");
        assert_eq!(ex[3].content, "teal");
        // No grounded file parameter: no example (nothing to copy).
        let plain = spec(json!({"type": "object", "properties": {"path": {"type": "string"}}, "required": ["path"]}));
        assert!(example_turns(&[plain], "example-0.txt").is_empty());
    }

    #[test]
    fn describes_tools_in_the_system_prompt() {
        let spec = ToolSpec {
            name: "read_file".into(),
            description: "Read a file.".into(),
            input_schema: json!({"type": "object", "properties": {"path": {"type": "string"}}, "required": ["path"]}),
            risk: cairn_core::tool::Risk::ReadOnly,
            capabilities: Default::default(),
            replay: cairn_core::tool::ReplayPolicy::Idempotent,
        };
        let s = system_prompt(Some("Be brief."), &[spec]);
        assert!(s.starts_with("Be brief."));
        assert!(s.contains(r#"- read_file: Read a file. Arguments: {"path": string}"#), "{s}");
    }
}
