//! Embedding cairn in a Rust program (`cargo run --example embed`): an
//! agent with one tool of the application's own and an approver, on the
//! scripted provider (a JSONL script standing in for the model, so the
//! example needs no key or network). Its session is an ordinary cairn
//! session: the example ends by printing the `cairn show` line that opens
//! it. With `--database URL` (`cargo run --example embed -- --database
//! postgres://…`) the session is kept in PostgreSQL instead, driven only by
//! this program (no `cairn worker` takes it).

use cairn_embed::{Agent, Event, Replay, Risk, ToolDef};
use serde_json::json;

fn main() -> anyhow::Result<()> {
    // cairn's home (sessions, configuration) and the session's directory.
    let root = std::env::temp_dir().join(format!("cairn-embed-example-{}", std::process::id()));
    let (home, work) = (root.join("home"), root.join("work"));
    std::fs::create_dir_all(&home)?;
    std::fs::create_dir_all(&work)?;

    // The model's two turns: call the tool, then answer.
    let script = root.join("script.jsonl");
    let call = json!({"toolCalls": [{"id": "c1", "name": "add_note", "arguments": {"text": "buy milk"}}]});
    let answer = json!({"text": "Noted: buy milk."});
    std::fs::write(&script, format!("{call}\n{answer}\n"))?;

    // The application's own tool: a Write call, so the approver is asked.
    let notes = work.join("notes.txt");
    let add_note = ToolDef::new(
        "add_note",
        "Append a line to the user's notes.",
        json!({"type": "object", "properties": {"text": {"type": "string"}}, "required": ["text"]}),
        Risk::Write,
        Replay::Never,
        move |args| {
            let text = args["text"].as_str().ok_or("text must be a string")?;
            let mut all = std::fs::read_to_string(&notes).unwrap_or_default();
            all.push_str(text);
            all.push('\n');
            std::fs::write(&notes, all).map_err(|e| e.to_string())?;
            Ok(format!("added {text:?}"))
        },
    );

    let database = match std::env::args().skip(1).collect::<Vec<_>>().as_slice() {
        [] => None,
        [flag, url] if flag == "--database" => Some(url.clone()),
        _ => anyhow::bail!("usage: embed [--database URL]"),
    };
    let mut builder = Agent::builder()
        .home(&home)
        .cwd(&work)
        .provider("scripted")
        .script(&script)
        .tool(add_note)
        // Asked about every Write call no rule allows and every Destructive
        // one; here it approves what is not Destructive.
        .approve(|q| {
            println!("approve? {} {} ({:?})", q.tool, q.arguments, q.risk);
            q.risk != Risk::Destructive
        });
    if let Some(url) = &database {
        // Claimed by id under a lease; a new process's `resume` takes it
        // over once a dead process's lease has expired.
        builder = builder.database(url);
    }
    let agent = builder.build()?;

    let mut on_event = |event: &Event| match event {
        Event::TextDelta { text } => print!("{text}"),
        Event::ToolStarted { tool, .. } => println!("[{tool} runs]"),
        Event::ToolCompleted { output, .. } => println!("[done: {output}]"),
        _ => {}
    };
    let outcome = agent.run_with("Remember to buy milk.", &mut on_event, &cairn_embed::CancelToken::new())?;
    println!();
    println!("answer: {}", outcome.answer);
    println!("tool calls: {}", outcome.tool_calls.len());
    match &database {
        None => println!("see it with: CAIRN_HOME={} cairn show {}", home.display(), outcome.session_id),
        Some(url) => println!("see it with: cairn --database '{url}' show {}", outcome.session_id),
    }
    Ok(())
}
