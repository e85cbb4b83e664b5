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
//! per leaf (`server.port: 8443`); anything else gives its non-empty lines,
//! a Markdown heading without its `#` marks (one that holds no digit is a
//! label, shown with the line under it: `Lead: Priya`).
//!
//! A record scores one for each word of the request it contains (modulo a
//! plural `s`; common words and the request's file names never count), or
//! whose kind of value it holds: `version` is matched by `2.7.1`, `time`
//! and `when` by `15:30`, `date` and `when` by `2026-12-01`, `email` by an
//! address, `url`/`link`/`website` by `https://…` (see [`SHAPES`]). The
//! best record is returned when it stands out: a higher score than every
//! other, or the same score as headings only (a heading names a part of the
//! file, so at equal score the line under it is the answer: `# Menu`
//! against `Main: mushroom risotto` for "the main course on the menu").
//! When several records tie and the request asks for the first, latest or
//! newest one, the first of them is returned (changelogs and lists put it
//! on top); the last, oldest or earliest, the last of them. When no record
//! shares a word with the request, such a request ("the first item") gets
//! the first (or last) line that is not a heading. A file's only line is
//! pointed at too when it matches: a result without a pointer looks like
//! the example exchange's (`chat.rs`, which has none), and the model then
//! copied the example's value (measured).
//!
//! Lexical only: a request whose words are not in the answer's line gets no
//! pointer, and a wrong pointer is possible when another line shares more
//! words. This module sees text only; it must not know about tools, the
//! model or the prompt's form (`chat.rs` decides where the line goes).

use std::collections::HashMap;
use std::sync::{Mutex, OnceLock};

use serde_json::Value;

use crate::describe::{request_words, same_word};

/// At most this many records are scored (a longer result is scored on its
/// first ones: the pointer is a help, not a search engine).
const MAX_RECORDS: usize = 2_000;

/// A record longer than this is not pointed at (a minified file's one
/// line would be the whole result again).
const MAX_RECORD_CHARS: usize = 300;

/// Request words that name a kind of value, and whether a word of a record
/// is a value of that kind. A record holding such a value scores for the
/// word as if it contained it (`## 2.7.1` for "the latest version").
const SHAPES: &[(&[&str], Shape)] = &[
    (&["version", "release"], is_version),
    (&["time", "when", "hour"], is_clock_time),
    (&["date", "when", "day"], is_date),
    (&["email", "mail"], is_email),
    (&["url", "link", "website", "homepage", "site"], is_url),
];

/// Whether a word of a record is a value of some kind.
type Shape = fn(&str) -> bool;

/// One record of a result: the text scored, the text shown, and whether it
/// is a Markdown heading.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Record {
    text: String,
    shown: String,
    heading: bool,
}

/// Results recently focused, so a conversation re-rendered on every model
/// call does not score its old results again (keyed by a hash of the
/// request and the result, so results are not kept twice; bounded,
/// cleared when full).
type FocusCache = HashMap<u64, Option<String>>;

/// Entries of the cache before it is cleared.
const CACHE_ENTRIES: usize = 64;

/// [`focus_line`], remembered for the last few (request, result) pairs.
pub(crate) fn focus_line_cached(content: &str, request: &str) -> Option<String> {
    static CACHE: OnceLock<Mutex<FocusCache>> = OnceLock::new();
    let cache = CACHE.get_or_init(|| Mutex::new(HashMap::new()));
    let key = {
        use std::hash::{Hash, Hasher};
        let mut h = std::collections::hash_map::DefaultHasher::new();
        (request, content).hash(&mut h);
        h.finish()
    };
    if let Ok(map) = cache.lock()
        && let Some(hit) = map.get(&key)
    {
        return hit.clone();
    }
    let found = focus_line(content, request);
    if let Ok(mut map) = cache.lock() {
        if map.len() >= CACHE_ENTRIES {
            map.clear();
        }
        map.insert(key, found.clone());
    }
    found
}

/// The record of `content` that best matches `request`, if one stands out.
pub(crate) fn focus_line(content: &str, request: &str) -> Option<String> {
    let records = records(content);
    let mut said: Vec<String> = request_words(request).into_iter().filter(|w| !names_a_file(w, request)).collect();
    // A word naming a kind of value counts even when it is a common word
    // (`when`).
    for word in request.split(|c: char| !c.is_alphanumeric()).map(str::to_lowercase) {
        if SHAPES.iter().any(|(names, _)| names.contains(&word.as_str())) && !said.contains(&word) {
            said.push(word);
        }
    }
    if said.is_empty() {
        return None;
    }
    let scored: Vec<(usize, &Record)> = records.iter().take(MAX_RECORDS).map(|r| (score(&said, &r.text), r)).collect();
    let best = scored.iter().map(|(s, _)| *s).max().unwrap_or(0);
    if best == 0 {
        // No word in common: "the first item" is still the first line that
        // is not a heading (and "the last" the last).
        let mut lines = records.iter().filter(|r| !r.heading);
        let chosen = match ordinal(request)? {
            Ordinal::First => lines.next(),
            Ordinal::Last => lines.next_back(),
        }?;
        return pointed(chosen);
    }
    let top: Vec<&Record> = scored.iter().filter(|(s, _)| *s == best).map(|(_, r)| *r).collect();
    // At equal score a heading gives way to a line under it.
    let lines: Vec<&Record> = top.iter().copied().filter(|r| !r.heading).collect();
    let top = if lines.is_empty() { top } else { lines };
    let chosen = match top.as_slice() {
        [one] => *one,
        [first, .., last] => match ordinal(request) {
            Some(Ordinal::First) => *first,
            Some(Ordinal::Last) => *last,
            None => return None,
        },
        [] => return None,
    };
    pointed(chosen)
}

/// What is shown for `chosen`: its text, unless it is too long.
fn pointed(chosen: &Record) -> Option<String> {
    (chosen.shown.chars().count() <= MAX_RECORD_CHARS).then(|| chosen.shown.clone())
}

/// Which of several equal records a request asks for.
enum Ordinal {
    First,
    Last,
}

/// Whether the request asks for the first (latest, newest, top) or the last
/// (oldest, earliest, bottom) of something.
fn ordinal(request: &str) -> Option<Ordinal> {
    let words: Vec<String> =
        request.split(|c: char| !c.is_alphanumeric()).filter(|w| !w.is_empty()).map(str::to_lowercase).collect();
    let has = |list: &[&str]| words.iter().any(|w| list.contains(&w.as_str()));
    let first = has(&["first", "latest", "newest"]);
    let last = has(&["last", "oldest", "earliest"]);
    match (first, last) {
        (true, false) => Some(Ordinal::First),
        (false, true) => Some(Ordinal::Last),
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

/// How many of the request's words `record` contains, or holds a value
/// of the kind they name ([`SHAPES`]).
fn score(said: &[String], record: &str) -> usize {
    let raw: Vec<&str> = record
        .split(|c: char| c.is_whitespace() || matches!(c, ',' | ';' | '(' | ')' | '[' | ']' | '<' | '>' | '"' | '\''))
        .map(|w| w.trim_end_matches(['.', ':', '!', '?']))
        .filter(|w| !w.is_empty())
        .collect();
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
    said.iter()
        .filter(|s| {
            words.iter().any(|w| same_word(w, s))
                || SHAPES.iter().any(|(names, shape)| names.contains(&s.as_str()) && raw.iter().any(|w| shape(w)))
        })
        .count()
}

/// `1.2`, `2.7.1`, `v0.9.13`, `1.14.0-rc1`: digits in at least two
/// dot-separated parts, after an optional `v`.
fn is_version(word: &str) -> bool {
    let w = word.strip_prefix(['v', 'V']).unwrap_or(word);
    let core = w.split(['-', '+']).next().unwrap_or_default();
    let parts: Vec<&str> = core.split('.').collect();
    parts.len() >= 2 && parts.iter().all(|p| !p.is_empty() && p.bytes().all(|b| b.is_ascii_digit()))
}

/// `15:30`, `9:05`, `07:45:10`.
fn is_clock_time(word: &str) -> bool {
    let parts: Vec<&str> = word.split(':').collect();
    (2..=3).contains(&parts.len())
        && parts.first().is_some_and(|h| (1..=2).contains(&h.len()))
        && parts.iter().all(|p| !p.is_empty() && p.len() <= 2 && p.bytes().all(|b| b.is_ascii_digit()))
}

/// `2026-12-01`, `01/12/2026`, `12.1.26`: three numeric parts joined by one
/// separator, one of them a year or all short.
fn is_date(word: &str) -> bool {
    ['-', '/', '.'].iter().any(|sep| {
        let parts: Vec<&str> = word.split(*sep).collect();
        parts.len() == 3
            && parts.iter().all(|p| (1..=4).contains(&p.len()) && p.bytes().all(|b| b.is_ascii_digit()))
            && (*sep != '.' || parts.iter().any(|p| p.len() == 4))
    })
}

/// `name@example.org`.
fn is_email(word: &str) -> bool {
    word.split_once('@').is_some_and(|(user, host)| !user.is_empty() && host.contains('.') && !host.starts_with('.'))
}

/// `https://…`, `http://…`, `www.…`.
fn is_url(word: &str) -> bool {
    let w = word.to_ascii_lowercase();
    w.starts_with("https://") || w.starts_with("http://") || (w.starts_with("www.") && w.len() > 4)
}

/// `content` cut into records: CSV rows, JSON leaves, or lines.
fn records(content: &str) -> Vec<Record> {
    let plain = |text: String| Record { shown: text.clone(), text, heading: false };
    if let Some(rows) = csv_records(content) {
        return rows.into_iter().map(plain).collect();
    }
    let trimmed = content.trim_start();
    if (trimmed.starts_with('{') || trimmed.starts_with('['))
        && let Ok(value) = serde_json::from_str::<Value>(content)
    {
        let mut out = Vec::new();
        leaves(&value, &mut String::new(), &mut out);
        return out.into_iter().map(plain).collect();
    }
    let lines: Vec<&str> = content.lines().map(str::trim).filter(|l| !l.is_empty()).collect();
    fn heading(l: &str) -> Option<&str> {
        let text = l.trim_start_matches('#');
        (text.len() < l.len() && text.starts_with(' ') && !text.trim().is_empty()).then(|| text.trim())
    }
    lines
        .iter()
        .enumerate()
        .map(|(i, l)| match heading(l) {
            // A Markdown heading is shown without its marks; one that holds
            // no value (`## Lead`) is a label for the line under it, shown
            // with it (`Lead: Priya`).
            Some(text) => {
                let under = lines.get(i + 1).filter(|next| heading(next).is_none());
                let shown = match under {
                    Some(next) if !text.chars().any(|c| c.is_ascii_digit()) => format!("{text}: {next}"),
                    _ => text.to_owned(),
                };
                Record { text: text.to_owned(), shown, heading: true }
            }
            None => plain((*l).to_owned()),
        })
        .collect()
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
        // A tie between two lines.
        assert_eq!(focus_line("red apple\nred pear\n", "What is red?"), None);
        // No shared word; the file's own name does not count.
        assert_eq!(focus_line("alpha\nbeta\n", "Read notes.txt please"), None);
        assert_eq!(focus_line("notes one\nnotes two three\n", "Summarise notes.txt"), None);
        assert_eq!(focus_line("The launch code is 7731.\n", "Read notes.txt please"), None);
        // Empty request words.
        assert_eq!(focus_line("a\nb\n", "what is it?"), None);
        // An ordinal without a file to apply it to.
        assert_eq!(focus_line("", "What is the first item?"), None);
        assert_eq!(focus_line("# Only a heading\n", "What is the first item?"), None);
        // Two headings of equal score and no ordinal in the request.
        assert_eq!(focus_line("## 1.2.0\n- a\n## 1.1.0\n- b\n", "Which version fixed it?"), None);
    }

    #[test]
    fn the_first_or_last_item_is_found_without_a_shared_word() {
        let todo = "# Todo\n1. Renew the passport\n2. Water the plants\n";
        assert_eq!(focus_line(todo, "What is the first item in todo.md?").as_deref(), Some("1. Renew the passport"));
        assert_eq!(focus_line(todo, "And the last entry?").as_deref(), Some("2. Water the plants"));
        assert_eq!(focus_line(todo, "What is in todo.md?"), None, "no ordinal: no pointer");
    }

    #[test]
    fn a_single_line_that_matches_is_pointed_at() {
        // The same form as every other result (the example shows it).
        assert_eq!(
            focus_line("The launch code is 7731.\n", "Read notes.txt and tell me the launch code.").as_deref(),
            Some("The launch code is 7731.")
        );
        let recipe = "# Pancakes\nYou need 3 eggs and 200 g of flour.\n";
        assert_eq!(
            focus_line(recipe, "How much flour does recipe.md call for?").as_deref(),
            Some("You need 3 eggs and 200 g of flour.")
        );
        assert_eq!(focus_line("# Notes\n", "What is the first item?"), None, "a heading alone is no item");
    }

    #[test]
    fn a_heading_gives_way_to_the_line_under_it() {
        let menu = "# Menu\nStarter: tomato soup\nMain: mushroom risotto\n";
        assert_eq!(focus_line(menu, "What is the main course on the menu?").as_deref(), Some("Main: mushroom risotto"));
    }

    #[test]
    fn a_heading_that_holds_the_value_is_pointed_at_without_its_marks() {
        // The version is the heading itself: the request's "version" is
        // matched by its shape.
        let changelog = "# Changelog\n## 2.7.1\n- fixed the crash on start\n";
        assert_eq!(focus_line(changelog, "Check CHANGELOG.md: what is the latest version?").as_deref(), Some("2.7.1"));
        // Several versions: the latest is the first (changelogs put it on
        // top), the oldest the last.
        let long = "# Changes\n## v3.0.0 - 2026-11-02\n- new api\n## v2.9.4 - 2026-08-30\n- fixes\n";
        assert_eq!(focus_line(long, "What is the newest release?").as_deref(), Some("v3.0.0 - 2026-11-02"));
        assert_eq!(focus_line(long, "What was the oldest version here?").as_deref(), Some("v2.9.4 - 2026-08-30"));
        // A heading that is a label is shown with the line under it.
        let team = "# Team\n## Lead\nPriya\n## Members\nTomas, Ana\n";
        assert_eq!(focus_line(team, "Who is the lead?").as_deref(), Some("Lead: Priya"));
    }

    #[test]
    fn values_of_the_kind_asked_for_count_as_matches() {
        let letter = "Dear Sam,\nthe meeting moved.\nSee you at 15:30 in room 4.\n";
        assert_eq!(focus_line(letter, "When is it?").as_deref(), Some("See you at 15:30 in room 4."));
        let contact = "Ana Ruiz\nana@example.org\nhttps://ana.example.org\n";
        assert_eq!(focus_line(contact, "What is her email?").as_deref(), Some("ana@example.org"));
        assert_eq!(focus_line(contact, "What is her website?").as_deref(), Some("https://ana.example.org"));
        let notes = "Trip notes\nLeaving on 2026-03-14\nBring boots\n";
        assert_eq!(focus_line(notes, "What date do we leave?").as_deref(), Some("Leaving on 2026-03-14"));
        let cases: [(Shape, &[&str], &[&str]); 5] = [
            (is_version, &["1.2", "2.7.1", "v0.9.13", "1.14.0-rc1"], &["1", "a.b", "1..2", "v"]),
            (is_clock_time, &["15:30", "9:05", "07:45:10"], &["1530", "123:4", "a:b", ":30"]),
            (is_date, &["2026-12-01", "01/12/2026", "1.12.2026"], &["1.2.3", "2026", "a-b-c", "1-2"]),
            (is_email, &["a@b.org"], &["@b.org", "a@b", "a@.org"]),
            (is_url, &["https://x.org", "http://x", "www.x.org"], &["x.org", "www."]),
        ];
        for (shape, yes, no) in cases {
            for w in yes {
                assert!(shape(w), "{w} should match");
            }
            for w in no {
                assert!(!shape(w), "{w} should not match");
            }
        }
    }

    #[test]
    fn the_cache_gives_what_focusing_gives() {
        let csv = "item,price\napple,3\ncherry,12\n";
        let request = "Open prices.csv and tell me the price of a cherry.";
        for _ in 0..2 {
            assert_eq!(focus_line_cached(csv, request), focus_line(csv, request));
            assert_eq!(focus_line_cached(csv, request).as_deref(), Some("item: cherry, price: 12"));
        }
        assert_eq!(focus_line_cached(csv, "Read prices.csv please"), None);
    }

    #[test]
    fn a_table_with_ragged_rows_is_read_as_lines() {
        let ragged = "a,b\n1,2,3\nx,cherry\n";
        assert_eq!(focus_line(ragged, "cherry?").as_deref(), Some("x,cherry"));
    }
}
