//! Fuzz target for the shell command-line parser behind allow patterns: any
//! text parses or is refused, never panics; an accepted line, written back
//! with every word single-quoted and the commands joined by `;`, parses to
//! the same commands (what a pattern judged is exactly what was read), and
//! no accepted command starts with a word the parser must refuse.
#![no_main]

use cairn_core::approval::cmdline::parse;
use libfuzzer_sys::fuzz_target;

/// A word as a POSIX shell reads it literally: single quotes, with each
/// `'` closed, escaped and reopened.
fn quoted(word: &str) -> String {
    format!("'{}'", word.replace('\'', r"'\''"))
}

fuzz_target!(|data: &[u8]| {
    let Ok(line) = std::str::from_utf8(data) else { return };
    let Ok(commands) = parse(line) else { return };
    assert!(!commands.is_empty() && commands.iter().all(|c| !c.is_empty()), "{line:?} gave an empty command");
    let written: Vec<String> =
        commands.iter().map(|c| c.iter().map(|w| quoted(w)).collect::<Vec<_>>().join(" ")).collect();
    let again = written.join("; ");
    match parse(&again) {
        Ok(reparsed) => assert_eq!(reparsed, commands, "{line:?} written back as {again:?}"),
        Err(e) => panic!("{line:?} was accepted but its words written back as {again:?} were refused: {e}"),
    }
});
