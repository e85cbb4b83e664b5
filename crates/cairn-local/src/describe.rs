//! Files a request describes without naming them: "my notes", "the config
//! file", "the CSV", "the Python source", "the people directory". The words
//! of the request are matched against the parts of each candidate path (its
//! file name's words, its extension by the kind of file it is, its
//! directories), and the best-matching files are what the embedded model's
//! first call may read (see `provider.rs`): a small model given the choice
//! of every file wanders; given the few the request points at, it reads the
//! right one.
//!
//! Scoring, per file: 3 for each request word that is a word of its name
//! (`notes` in `notes.txt`, `sales` in `data/2026/sales.csv`), 2 for each
//! word that names its kind (`csv`, `json`, `python` → `.py`, `config` →
//! `.ini`/`.toml`/…, `manifest` → `package.json`/`Cargo.toml`, …), 1 for
//! each word that names one of its directories. Plurals match singulars
//! (`guest` ~ `guests.txt`). Common words never match. Only the files with
//! the highest score are kept, and none when nothing scores.
//!
//! This module works on the candidate list only (never file contents) and
//! must not know about the model.

use crate::ground::PathCandidates;

/// Words that say nothing about which file is meant.
const COMMON: &[&str] = &[
    "a",
    "an",
    "and",
    "are",
    "at",
    "be",
    "by",
    "can",
    "check",
    "code",
    "codebase",
    "contents",
    "did",
    "directory",
    "do",
    "does",
    "file",
    "files",
    "find",
    "first",
    "folder",
    "for",
    "from",
    "give",
    "here",
    "how",
    "in",
    "into",
    "is",
    "it",
    "its",
    "look",
    "many",
    "me",
    "much",
    "my",
    "of",
    "on",
    "one",
    "open",
    "or",
    "our",
    "please",
    "project",
    "read",
    "says",
    "search",
    "set",
    "show",
    "some",
    "somewhere",
    "tell",
    "that",
    "the",
    "there",
    "these",
    "this",
    "through",
    "to",
    "under",
    "was",
    "were",
    "what",
    "whats",
    "when",
    "where",
    "which",
    "who",
    "why",
    "with",
    "written",
    "you",
    "your",
];

/// Words naming a kind of file, and the extensions (or whole names) of
/// that kind.
const KINDS: &[(&[&str], &[&str])] = &[
    (&["text", "txt"], &["txt"]),
    (&["markdown", "md"], &["md", "markdown"]),
    (&["csv", "spreadsheet", "table"], &["csv", "tsv"]),
    (&["json"], &["json"]),
    (&["yaml", "yml"], &["yaml", "yml"]),
    (&["toml"], &["toml"]),
    (&["ini"], &["ini"]),
    (&["html", "page", "webpage"], &["html", "htm"]),
    (&["css", "stylesheet"], &["css"]),
    (&["python"], &["py"]),
    (&["javascript", "js", "node"], &["js", "mjs", "cjs"]),
    (&["typescript"], &["ts", "tsx"]),
    (&["rust"], &["rs"]),
    (&["golang"], &["go"]),
    (&["java"], &["java"]),
    (&["c"], &["c", "h"]),
    (&["shell", "script", "bash"], &["sh", "bash"]),
    (
        &["config", "configuration", "configured", "settings", "conf"],
        &["ini", "toml", "yaml", "yml", "json", "cfg", "conf"],
    ),
    (&["source", "program", "module"], &["rs", "py", "js", "ts", "go", "c", "h", "java", "rb", "cpp", "cc"]),
    (&["manifest", "package"], &["package.json", "cargo.toml", "pyproject.toml", "go.mod"]),
    (&["readme"], &["readme.md", "readme.txt", "readme"]),
    (&["makefile"], &["makefile"]),
    (&["log"], &["log"]),
];

/// A request's words, lower-case, without punctuation and common words.
pub(crate) fn request_words(text: &str) -> Vec<String> {
    text.split(|c: char| !c.is_alphanumeric() && c != '_')
        .map(str::to_lowercase)
        .map(|w| w.strip_suffix("'s").map_or(w.clone(), str::to_owned))
        .filter(|w| !w.is_empty() && !COMMON.contains(&w.as_str()))
        .collect()
}

/// Whether two words are the same modulo a plural `s`.
pub(crate) fn same_word(a: &str, b: &str) -> bool {
    a == b || a.strip_suffix('s') == Some(b) || b.strip_suffix('s') == Some(a)
}

/// How well the request's `said` words describe the file at `path`.
fn score(said: &[String], path: &str) -> u32 {
    let lower = path.to_lowercase();
    let (dirs, name) = lower.rsplit_once('/').map_or(("", lower.as_str()), |(d, n)| (d, n));
    let (stem, ext) = name.rsplit_once('.').filter(|(s, _)| !s.is_empty()).unwrap_or((name, ""));
    let name_words: Vec<&str> = stem.split(|c: char| !c.is_alphanumeric()).filter(|w| w.len() > 1).collect();
    let dir_words: Vec<&str> = dirs.split(|c: char| !c.is_alphanumeric()).filter(|w| w.len() > 1).collect();
    let mut total = 0;
    for w in said {
        if w.len() > 2 && name_words.iter().any(|n| same_word(n, w)) {
            total += 3;
        }
        let kind = KINDS
            .iter()
            .any(|(names, exts)| names.contains(&w.as_str()) && exts.iter().any(|e| *e == ext || *e == name))
            || (w.len() > 1 && *w == ext);
        if kind {
            total += 2;
        }
        if w.len() > 2 && dir_words.iter().any(|d| same_word(d, w)) {
            total += 1;
        }
    }
    total
}

/// The files of `candidates` that `request` describes best (empty when no
/// file matches any of its words).
pub fn described_files(request: &str, candidates: &PathCandidates) -> Vec<String> {
    let said = request_words(request);
    if said.is_empty() {
        return Vec::new();
    }
    let scored: Vec<(u32, &String)> = candidates.files().iter().map(|f| (score(&said, f), f)).collect();
    let best = scored.iter().map(|(s, _)| *s).max().unwrap_or(0);
    if best == 0 {
        return Vec::new();
    }
    scored.into_iter().filter(|(s, _)| *s == best).map(|(_, f)| f.clone()).collect()
}

/// Words that ask for something to be found in the tree rather than in a
/// file the request points at.
const FIND_WORDS: &[&str] = &["find", "search", "somewhere", "locate", "grep", "codebase", "anywhere"];

/// What a request asks to search the tree for, when it asks that: the
/// identifiers it names (`RETRY_LIMIT`, `buffer_size`, `maxClients`), else
/// — when it says to find or search — its runs of uncommon words ("pass
/// phrase", "magic number"). Empty when it asks nothing of the kind. Each
/// is a literal a `search` pattern may take (regex metacharacters cannot
/// occur: only letters, digits, `_` and single spaces).
pub fn search_terms(request: &str) -> Vec<String> {
    let raw: Vec<&str> = request.split(|c: char| !c.is_alphanumeric() && c != '_').filter(|w| !w.is_empty()).collect();
    let identifier = |w: &str| {
        let has_upper = w.chars().any(|c| c.is_ascii_uppercase());
        let has_lower = w.chars().any(|c| c.is_ascii_lowercase());
        w.len() > 3
            && w.chars().all(|c| c.is_ascii_alphanumeric() || c == '_')
            && !w.starts_with(|c: char| c.is_ascii_digit())
            && (w.contains('_')
                || (has_upper && !has_lower && w.len() > 4)
                || (has_lower && w[1..].chars().any(|c| c.is_ascii_uppercase())))
    };
    let mut out: Vec<String> = raw.iter().filter(|w| identifier(w)).map(|w| (*w).to_owned()).collect();
    out.dedup();
    if !out.is_empty() {
        return out;
    }
    let lower: Vec<String> = raw.iter().map(|w| w.to_lowercase()).collect();
    if !lower.iter().any(|w| FIND_WORDS.contains(&w.as_str())) {
        return Vec::new();
    }
    let mut run: Vec<&str> = Vec::new();
    for w in lower.iter().map(String::as_str).chain([""]) {
        if !w.is_empty() && !COMMON.contains(&w) && !FIND_WORDS.contains(&w) && w.len() > 2 {
            run.push(w);
            continue;
        }
        if !run.is_empty() {
            let phrase = run.join(" ");
            if !out.contains(&phrase) {
                out.push(phrase);
            }
            run.clear();
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn files(list: &[&str]) -> PathCandidates {
        PathCandidates::from_lists(list.iter().map(|s| (*s).to_owned()).collect(), vec![".".into()])
    }

    #[test]
    fn descriptions_point_at_the_files_they_describe() {
        let cases: &[(&str, &[&str], &[&str])] = &[
            ("Read my notes and tell me the code.", &["notes.txt", "todo.md"], &["notes.txt"]),
            ("What port does the config file set?", &["config.ini", "main.py"], &["config.ini"]),
            ("Look in the CSV file: what does tea cost?", &["prices.csv", "README.md"], &["prices.csv"]),
            ("What version does the package manifest give?", &["package.json", "app.js"], &["package.json"]),
            ("Check the guest list", &["guests.txt", "menu.md"], &["guests.txt"]),
            ("In the Python source, what is X?", &["app.py", "notes.txt"], &["app.py"]),
            ("the server's configuration", &["server/ports.ini", "client/app.ini"], &["server/ports.ini"]),
            ("the second quarter report", &["reports/q1.csv", "reports/q2.csv"], &["reports/q1.csv", "reports/q2.csv"]),
            (
                "Where does Bob live? Look in the people directory.",
                &["people/alice.txt", "people/bob.txt"],
                &["people/bob.txt"],
            ),
        ];
        for (request, list, want) in cases {
            assert_eq!(described_files(request, &files(list)), *want, "{request:?}");
        }
    }

    #[test]
    fn identifiers_and_things_to_find_become_search_terms() {
        assert_eq!(search_terms("What is RETRY_LIMIT set to in this codebase?"), ["RETRY_LIMIT"]);
        assert_eq!(search_terms("Search the code for BUFFER_SIZE: what is its value?"), ["BUFFER_SIZE"]);
        assert_eq!(search_terms("where is maxClients set"), ["maxClients"]);
        assert_eq!(
            search_terms("Find the file with the pass phrase and tell me the phrase."),
            ["pass phrase", "phrase"]
        );
        assert_eq!(search_terms("Search these files for the magic number and tell me what it is."), ["magic number"]);
        for nothing in ["What is the capital of France?", "Read notes.txt please", "Hello", "Tell me about NASA"] {
            assert!(search_terms(nothing).is_empty(), "{nothing:?}");
        }
    }

    #[test]
    fn a_request_about_nothing_on_disk_points_nowhere() {
        for request in ["What is the capital of France?", "Hello!", "", "how are you"] {
            assert!(
                described_files(request, &files(&["notes.txt", "src/main.rs", "Cargo.toml"])).is_empty(),
                "{request:?}"
            );
        }
    }
}
