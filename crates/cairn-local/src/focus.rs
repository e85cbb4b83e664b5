//! The part of a tool result that answers the request: the one line (or
//! CSV row, or JSON value) sharing the most words with what the person
//! asked. The embedded model is shown it right after the result ("The line
//! that matches your request: …"): a 135M model copies a value out of a
//! line it is pointed at, but picks the wrong row of a table or key of an
//! object when it must choose among similar ones (measured, BENCHMARKS.md).
//!
//! How a result is cut into records: a CSV table (a header row and rows of
//! the same number of fields) gives one record per row, each field named by
//! its header (`item: cherry, price: 12`); a JSON document gives one record
//! per leaf (`server.port: 8443`); anything else gives its non-empty lines.
//! A record scores one for each word of the request it contains (modulo a
//! plural `s`; common words and the request's file names never count). Only
//! a unique best record with a positive score is returned, and nothing for
//! a result of a single record (there is nothing to choose).
//!
//! Lexical only: a request whose words are not in the answer's line gets no
//! pointer, and a wrong pointer is possible when another line shares more
//! words. This module sees text only; it must not know about tools, the
//! model or the prompt's form (`chat.rs` decides where the line goes).

use serde_json::Value;

use crate::describe::{request_words, same_word};

/// At most this many records are scored (a longer result is scored on its
/// first ones: the pointer is a help, not a search engine).
const MAX_RECORDS: usize = 2_000;

/// A record longer than this is not pointed at (a minified file's one
/// line would be the whole result again).
const MAX_RECORD_CHARS: usize = 300;

/// The record of `content` that best matches `request`, if one stands out.
pub(crate) fn focus_line(content: &str, request: &str) -> Option<String> {
    let records = records(content);
    if records.len() < 2 {
        return None;
    }
    let said: Vec<String> = request_words(request).into_iter().filter(|w| !names_a_file(w, request)).collect();
    if said.is_empty() {
        return None;
    }
    let mut best: Option<(usize, &String)> = None;
    let mut tied = false;
    for record in records.iter().take(MAX_RECORDS) {
        let score = score(&said, record);
        match best {
            Some((b, _)) if score < b => {}
            Some((b, _)) if score == b => tied = true,
            _ => {
                best = Some((score, record));
                tied = false;
            }
        }
    }
    match best {
        Some((score, record)) if score > 0 && !tied && record.chars().count() <= MAX_RECORD_CHARS => {
            Some(record.clone())
        }
        _ => None,
    }
}

/// Whether `word` is part of a file name the request spells out
/// (`prices` of `prices.csv`): it says which file, not which line.
fn names_a_file(word: &str, request: &str) -> bool {
    request
        .split(|c: char| c.is_whitespace() || matches!(c, '\'' | '"' | '`' | ',' | '?' | '!' | ':' | ';' | '(' | ')'))
        .filter(|t| t.contains('.') || t.contains('/'))
        .map(|t| t.trim_end_matches('.'))
        .filter(|t| t.contains('.') || t.contains('/'))
        .any(|t| t.to_lowercase().split(|c: char| !c.is_alphanumeric() && c != '_').any(|part| part == word))
}

/// How many of the request's words `record` contains.
fn score(said: &[String], record: &str) -> usize {
    let words: Vec<String> = record
        .split(|c: char| !c.is_alphanumeric() && c != '_' && c != '-')
        .flat_map(|w| {
            // `MAX_CLIENTS` also as `max` and `clients`; `fontSize` stays whole.
            let mut parts = vec![w.to_lowercase()];
            if w.contains(['_', '-']) {
                parts.extend(w.split(['_', '-']).map(str::to_lowercase));
            }
            parts
        })
        .filter(|w| !w.is_empty())
        .collect();
    said.iter().filter(|s| words.iter().any(|w| same_word(w, s))).count()
}

/// `content` cut into records: CSV rows, JSON leaves, or lines.
fn records(content: &str) -> Vec<String> {
    if let Some(rows) = csv_records(content) {
        return rows;
    }
    let trimmed = content.trim_start();
    if (trimmed.starts_with('{') || trimmed.starts_with('['))
        && let Ok(value) = serde_json::from_str::<Value>(content)
    {
        let mut out = Vec::new();
        leaves(&value, &mut String::new(), &mut out);
        return out;
    }
    // A Markdown heading names a part of the file, not a value in it: it
    // would tie with the line that answers (`# Menu` against
    // `Main: mushroom risotto` for "the main course on the menu").
    let heading = |l: &str| l.starts_with('#') && l.trim_start_matches('#').starts_with(' ');
    content.lines().map(str::trim).filter(|l| !l.is_empty() && !heading(l)).map(str::to_owned).collect()
}

/// A comma-separated table with a header row: every non-empty line has the
/// header's number of fields (at least two), and there are at least two
/// rows under it. Quoted fields with commas are not split (such a file is
/// taken as lines).
fn csv_records(content: &str) -> Option<Vec<String>> {
    let lines: Vec<&str> = content.lines().map(str::trim).filter(|l| !l.is_empty()).collect();
    let (header, rows) = lines.split_first()?;
    if rows.len() < 2 || content.contains('"') {
        return None;
    }
    let names: Vec<&str> = header.split(',').map(str::trim).collect();
    if names.len() < 2 || names.iter().any(|n| n.is_empty() || n.parse::<f64>().is_ok()) {
        return None;
    }
    let mut out = Vec::with_capacity(rows.len());
    for row in rows {
        let fields: Vec<&str> = row.split(',').map(str::trim).collect();
        if fields.len() != names.len() {
            return None;
        }
        let named: Vec<String> = names.iter().zip(&fields).map(|(n, f)| format!("{n}: {f}")).collect();
        out.push(named.join(", "));
    }
    Some(out)
}

/// One `path: value` record per scalar of a JSON value (`a.b: 1`,
/// `items.0: x`).
fn leaves(value: &Value, path: &mut String, out: &mut Vec<String>) {
    let child = |key: &str, v: &Value, path: &mut String, out: &mut Vec<String>| {
        let len = path.len();
        if !path.is_empty() {
            path.push('.');
        }
        path.push_str(key);
        leaves(v, path, out);
        path.truncate(len);
    };
    match value {
        Value::Object(map) => map.iter().for_each(|(k, v)| child(k, v, path, out)),
        Value::Array(items) => items.iter().enumerate().for_each(|(i, v)| child(&i.to_string(), v, path, out)),
        Value::String(s) => out.push(format!("{path}: {s}")),
        other => out.push(format!("{path}: {other}")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn points_at_the_csv_row_the_request_names() {
        let csv = "item,price\napple,3\npear,5\ncherry,12\n";
        let got = focus_line(csv, "Open prices.csv and tell me the price of a cherry.");
        assert_eq!(got.as_deref(), Some("item: cherry, price: 12"));
        let contacts = "name,phone\nLena,555-0142\nOmar,555-0199\n";
        let got = focus_line(contacts, "Use contacts.csv to find Omar's phone number.");
        assert_eq!(got.as_deref(), Some("name: Omar, phone: 555-0199"));
    }

    #[test]
    fn points_at_the_json_leaf_the_request_names() {
        let json = r#"{"widgets": 83, "gadgets": 17}"#;
        assert_eq!(focus_line(json, "How many widgets are in inventory.json?").as_deref(), Some("widgets: 83"));
        let nested = r#"{"server": {"host": "a", "port": 8443}, "tags": ["x", "y"]}"#;
        assert_eq!(focus_line(nested, "Which port does the server use?").as_deref(), Some("server.port: 8443"));
    }

    #[test]
    fn points_at_the_line_of_plain_text() {
        let ini = "[server]\nhost = example.org\nport = 8443\n";
        assert_eq!(focus_line(ini, "What port is set in config.ini?").as_deref(), Some("port = 8443"));
        let rs = "const MAX_CLIENTS: usize = 256;\nfn main() {}\n";
        assert_eq!(
            focus_line(rs, "Read server.rs and tell me the value of MAX_CLIENTS.").as_deref(),
            Some("const MAX_CLIENTS: usize = 256;")
        );
    }

    #[test]
    fn says_nothing_when_nothing_stands_out() {
        // One line: nothing to choose.
        assert_eq!(focus_line("The launch code is 7731.\n", "Read notes.txt and tell me the launch code."), None);
        // A tie between two lines.
        assert_eq!(focus_line("red apple\nred pear\n", "What is red?"), None);
        // No shared word; the file's own name does not count.
        assert_eq!(focus_line("alpha\nbeta\n", "Read notes.txt please"), None);
        assert_eq!(focus_line("notes one\nnotes two three\n", "Summarise notes.txt"), None);
        // Empty request words.
        assert_eq!(focus_line("a\nb\n", "what is it?"), None);
    }

    #[test]
    fn a_heading_is_not_an_answer() {
        let menu = "# Menu\nStarter: tomato soup\nMain: mushroom risotto\n";
        assert_eq!(focus_line(menu, "What is the main course on the menu?").as_deref(), Some("Main: mushroom risotto"));
    }

    #[test]
    fn a_table_with_ragged_rows_is_read_as_lines() {
        let ragged = "a,b\n1,2,3\nx,cherry\n";
        assert_eq!(focus_line(ragged, "cherry?").as_deref(), Some("x,cherry"));
    }
}
