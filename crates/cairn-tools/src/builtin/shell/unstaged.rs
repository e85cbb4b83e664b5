//! What the unstaged judge reads beyond a line's words (issue 49.10): a
//! `for` loop over literal items (or `$(seq A B)`), judged as the lines its
//! iterations run, and output redirections to new files, which the line
//! then runs under bash's `noclobber` (`bash -C`), so a `>` can create a
//! file but never replace one that exists. A build step such as `mkdir -p
//! out && for i in $(seq 1 1000); do echo "object $i" > out/f$i.o; done`
//! is a Write unstaged instead of Unclassifiable.
//!
//! It is a security boundary (docs/tools.md, "The shapes table"): it
//! accepts only forms whose every effect it can name, and says
//! Unclassifiable for anything else. A redirection is accepted only to a
//! relative path that does not climb (`..`) and names no authority path
//! (`cairn_core::authority`: git's configuration and hooks, other agents'
//! configuration, `.cairn/`; those stay Destructive), or to `/dev/null`,
//! `/dev/stdout`, `/dev/stderr`; never `>|` (which overrides noclobber),
//! `<>`, a here-document, process substitution, or a line that changes
//! directory or shell options (`cd`, `set`, `shopt`), which would move the
//! target or lift noclobber. A loop's items must be plain words of
//! letters, digits and `._+-` (so substituting them is what bash does: no
//! splitting, no globbing), at most [`MAX_ITEMS`]; its body may use no
//! other expansion and holds no nested compound command. The words of
//! every command are judged by `classify` as before.
//!
//! It must not run anything, and must not be used for staged runs (staged,
//! the observed effect decides).

use cairn_core::approval::cmdline;

use super::classify::{Class, Reach, classify};

/// Most iterations a loop may have to be judged (each is classified).
pub const MAX_ITEMS: usize = 10_000;

/// Largest text a loop's iterations may come to.
const MAX_EXPANDED: usize = 4 << 20;

/// The unstaged judgement of a line.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Judged {
    /// Its class.
    pub class: Class,
    /// Whether it must run under `noclobber` (`bash -C`) for that class to
    /// hold: it redirects output into files.
    pub noclobber: bool,
}

fn unknown(why: impl Into<String>) -> Judged {
    Judged { class: Class::Unclassifiable { why: why.into() }, noclobber: false }
}

/// Judge `line` for an unstaged run.
pub fn judge(line: &str) -> Judged {
    let expanded = match expand_loop(line) {
        Ok(Some(text)) => text,
        Ok(None) => line.to_owned(),
        Err(why) => return unknown(why),
    };
    let (stripped, redirects) = match strip_redirects(&expanded) {
        Ok(found) => found,
        Err(why) => return unknown(why),
    };
    if redirects.is_empty() {
        return Judged { class: classify(&stripped), noclobber: false };
    }
    // The words of every command first: a line the tokenizer refuses, or
    // one that moves the target or lifts noclobber, is not judged further.
    let commands = match cmdline::words(&stripped) {
        Ok(commands) => commands,
        Err(e) => return unknown(format!("cannot be classified from its words: {e}")),
    };
    for word in commands.iter().flatten() {
        if matches!(word.as_str(), "cd" | "pushd" | "popd" | "set" | "shopt")
            || word.starts_with("+o")
            || word.starts_with("+C")
            || word.contains("noclobber")
        {
            return unknown(format!(
                "`{word}` in a line with redirections: it could move their targets or let `>` replace files"
            ));
        }
    }
    let mut class = classify(&stripped);
    let mut writes = false;
    let rules = cairn_core::authority::AuthorityRules::default();
    for redirect in &redirects {
        let Redirect::Write(target) = redirect else { continue };
        if matches!(target.as_str(), "/dev/null" | "/dev/stdout" | "/dev/stderr") {
            continue;
        }
        if target.is_empty() || target.starts_with('/') || target.split('/').any(|part| part == "..") {
            return unknown(format!(
                "a redirection to {}: outside the working tree, or climbing out of it",
                cairn_core::staged::shown(target)
            ));
        }
        if let Some(authority) = rules.classify(std::path::Path::new(""), target) {
            let why = format!("it writes {}", authority.reason());
            if class_rank(&class) < 1 {
                class = Class::Destructive { why, reach: Reach::Tree };
            }
            continue;
        }
        writes = true;
    }
    Judged { class, noclobber: writes }
}

fn class_rank(class: &Class) -> u8 {
    match class {
        Class::Plain => 0,
        Class::Destructive { reach: Reach::Tree, .. } => 1,
        Class::Unclassifiable { .. } => 2,
        Class::Destructive { reach: Reach::Beyond, .. } => 3,
    }
}

/// One redirection of a line.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Redirect {
    /// Output into this file (`>`, `>>`, `&>`, `N>`).
    Write(String),
    /// Input from a file, or a descriptor duplicated (`<`, `2>&1`).
    Other,
}

/// The line without its redirections (each replaced by a space), and the
/// redirections, their targets as bash reads them (quotes removed; any
/// expansion refused). Quotes and escapes are followed, so a `>` inside
/// quotes is text.
fn strip_redirects(line: &str) -> Result<(String, Vec<Redirect>), String> {
    let chars: Vec<char> = line.chars().collect();
    let mut out = String::with_capacity(line.len());
    let mut found = Vec::new();
    let mut i = 0;
    let (mut single, mut double) = (false, false);
    while i < chars.len() {
        let c = chars[i];
        if single {
            single = c != '\'';
            out.push(c);
            i += 1;
            continue;
        }
        if c == '\\' {
            out.push(c);
            if let Some(next) = chars.get(i + 1) {
                out.push(*next);
            }
            i += 2;
            continue;
        }
        if double {
            double = c != '"';
            out.push(c);
            i += 1;
            continue;
        }
        match c {
            '\'' => single = true,
            '"' => double = true,
            '>' | '<' => {
                // A descriptor number just before (`2>`) belongs to it.
                let mut fd_start = out.len();
                while fd_start > 0 && out.as_bytes()[fd_start - 1].is_ascii_digit() {
                    fd_start -= 1;
                }
                let at_word_start = fd_start == 0 || out[..fd_start].ends_with([' ', '\t', ';', '&', '|', '\n']);
                if at_word_start {
                    out.truncate(fd_start);
                }
                let (redirect, next) = redirection(&chars, i)?;
                found.push(redirect);
                out.push(' ');
                i = next;
                continue;
            }
            '&' if chars.get(i + 1) == Some(&'>') => {
                // `&>` and `&>>`: stdout and stderr into a file.
                let (redirect, next) = redirection(&chars, i + 1)?;
                if matches!(redirect, Redirect::Other) {
                    return Err("`&>&` is not a redirection cairn reads".to_owned());
                }
                found.push(redirect);
                out.push(' ');
                i = next;
                continue;
            }
            _ => {}
        }
        out.push(c);
        i += 1;
    }
    Ok((out, found))
}

/// The redirection whose operator starts at `chars[i]` (`>` or `<`), and
/// the index after its target.
fn redirection(chars: &[char], i: usize) -> Result<(Redirect, usize), String> {
    let op = chars[i];
    let mut j = i + 1;
    let next = chars.get(j).copied();
    let write = op == '>';
    match (op, next) {
        ('>', Some('|')) => return Err("`>|` (replaces a file whatever noclobber says)".to_owned()),
        ('>', Some('(')) | ('<', Some('(')) => return Err("process substitution".to_owned()),
        ('<', Some('<')) => return Err("a here-document or here-string".to_owned()),
        ('<', Some('>')) => return Err("`<>` (opens a file for reading and writing)".to_owned()),
        ('>', Some('>')) => j += 1,
        (_, Some('&')) => {
            // A descriptor duplicated (`>&2`, `2>&1`, `<&0`, `>&-`).
            j += 1;
            let start = j;
            while j < chars.len() && (chars[j].is_ascii_digit() || chars[j] == '-') {
                j += 1;
            }
            let ends = chars.get(j).is_none_or(|c| matches!(c, ' ' | '\t' | ';' | '&' | '|' | '\n'));
            if j == start || !ends {
                return Err("`>&` with a file name (write `> file 2>&1`)".to_owned());
            }
            return Ok((Redirect::Other, j));
        }
        _ => {}
    }
    while chars.get(j).is_some_and(|c| *c == ' ' || *c == '\t') {
        j += 1;
    }
    // The target: one word, up to an unquoted blank or operator.
    let start = j;
    let (mut single, mut double) = (false, false);
    while let Some(&c) = chars.get(j) {
        if single {
            single = c != '\'';
        } else if double {
            double = c != '"';
            if c == '\\' {
                j += 1;
            }
        } else if c == '\\' {
            j += 1;
        } else if c == '\'' {
            single = true;
        } else if c == '"' {
            double = true;
        } else if matches!(c, ' ' | '\t' | '\n' | ';' | '&' | '|' | '<' | '>' | '(' | ')') {
            break;
        }
        j += 1;
    }
    let raw: String = chars[start..j.min(chars.len())].iter().collect();
    if raw.is_empty() {
        return Err("a redirection without a target".to_owned());
    }
    let target = match cmdline::words(&raw) {
        Ok(commands) if commands.len() == 1 && commands[0].len() == 1 => commands[0][0].clone(),
        Ok(_) => return Err(format!("the redirection target {raw:?} is not one word")),
        Err(e) => return Err(format!("the redirection target {raw:?}: {e}")),
    };
    Ok((if write { Redirect::Write(target) } else { Redirect::Other }, j.min(chars.len())))
}

/// A piece of a line between unquoted separators, with the separator that
/// ends it (`;`, a newline, `&&`, `||`, `|`, `&`, or nothing at the end).
#[derive(Debug)]
struct Piece {
    text: String,
    sep: String,
}

/// Split `line` at its unquoted separators, keeping every character.
fn pieces(line: &str) -> Vec<Piece> {
    let chars: Vec<char> = line.chars().collect();
    let mut out = Vec::new();
    let mut text = String::new();
    let (mut single, mut double) = (false, false);
    let mut i = 0;
    while i < chars.len() {
        let c = chars[i];
        if single {
            single = c != '\'';
        } else if c == '\\' {
            // Outside single quotes (bare or in double quotes) a backslash
            // takes the next character with it: an escaped quote or
            // separator neither opens nor splits anything.
            text.push(c);
            i += 1;
            if let Some(n) = chars.get(i) {
                text.push(*n);
            }
            i += 1;
            continue;
        } else if double {
            double = c != '"';
        } else if c == '\'' {
            single = true;
        } else if c == '"' {
            double = true;
        } else if matches!(c, ';' | '\n' | '&' | '|') {
            let two = chars.get(i + 1).is_some_and(|n| (c == '&' || c == '|') && *n == c);
            // `&>` and `>&`/`2>&1` are redirections, not separators.
            let redirect = c == '&' && (chars.get(i + 1) == Some(&'>') || text.ends_with('>'));
            if !redirect {
                let sep: String = if two { [c, c].iter().collect() } else { c.to_string() };
                out.push(Piece { text: std::mem::take(&mut text), sep });
                i += if two { 2 } else { 1 };
                continue;
            }
        }
        text.push(c);
        i += 1;
    }
    out.push(Piece { text, sep: String::new() });
    out
}

/// The first word of a piece, as written.
fn first_word(text: &str) -> &str {
    text.split_whitespace().next().unwrap_or("")
}

/// `line` with its one `for` loop written out as the commands its
/// iterations run (`Ok(None)`: no loop; `Err`: a loop cairn cannot read).
fn expand_loop(line: &str) -> Result<Option<String>, String> {
    let parts = pieces(line);
    let Some(start) = parts.iter().position(|p| first_word(&p.text) == "for") else {
        return Ok(None);
    };
    let head = &parts[start];
    if head.sep != ";" && head.sep != "\n" {
        return Err("a `for` loop cairn cannot read (write `for NAME in ITEMS; do …; done`)".to_owned());
    }
    let words: Vec<&str> = head.text.split_whitespace().collect();
    let (name, items) = match words.as_slice() {
        ["for", name, "in", items @ ..] if is_name(name) => (*name, items),
        _ => return Err("a `for` loop cairn cannot read (write `for NAME in ITEMS; do …; done`)".to_owned()),
    };
    let values = loop_items(items)?;
    // The body: from `do` to the matching `done`.
    let Some(body_first) = parts.get(start + 1) else {
        return Err("a `for` loop without `do`".to_owned());
    };
    let Some(first_command) = body_first.text.trim_start().strip_prefix("do") else {
        return Err("a `for` loop without `do`".to_owned());
    };
    if !first_command.starts_with([' ', '\t']) {
        return Err("a `for` loop without `do`".to_owned());
    }
    let mut body = vec![Piece { text: first_command.to_owned(), sep: body_first.sep.clone() }];
    let mut end = None;
    for (k, piece) in parts.iter().enumerate().skip(start + 2) {
        if piece.text.trim() == "done" {
            end = Some(k);
            break;
        }
        body.push(Piece { text: piece.text.clone(), sep: piece.sep.clone() });
    }
    let Some(end) = end else { return Err("a `for` loop without its `done`".to_owned()) };
    // The last body command's separator is the one before `done`.
    for piece in &body {
        let word = first_word(&piece.text);
        if ["for", "while", "until", "do", "done", "if", "case", "select", "{", "}", "function"].contains(&word) {
            return Err(format!("a compound command (`{word}`) inside a `for` loop"));
        }
    }
    let mut out = String::new();
    for piece in &parts[..start] {
        out.push_str(&piece.text);
        out.push_str(&piece.sep);
    }
    for value in &values {
        for (k, piece) in body.iter().enumerate() {
            out.push_str(&substitute(&piece.text, name, value));
            out.push_str(if k + 1 == body.len() { ";" } else { &piece.sep });
        }
        if out.len() > MAX_EXPANDED {
            return Err(format!("a `for` loop whose iterations come to more than {MAX_EXPANDED} bytes"));
        }
    }
    if values.is_empty() {
        // Nothing runs: judged as a no-op in its place.
        out.push_str("true;");
    }
    // Every simple command is judged whatever joins it, so the loop's own
    // separator (`;`, `&&`, `|`) is written as the `;` already there.
    for piece in &parts[end + 1..] {
        out.push_str(&piece.text);
        out.push_str(&piece.sep);
    }
    Ok(Some(out))
}

fn is_name(word: &str) -> bool {
    let mut chars = word.chars();
    chars.next().is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_')
}

/// A loop's items: plain words, or `$(seq A B)` / `$(seq B)`.
fn loop_items(items: &[&str]) -> Result<Vec<String>, String> {
    let plain =
        |w: &str| !w.is_empty() && w.chars().all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '+' | '-'));
    let joined = items.join(" ");
    if let Some(inner) = joined.strip_prefix("$(seq ").and_then(|r| r.strip_suffix(')')) {
        let nums: Vec<i64> = inner
            .split_whitespace()
            .map(|n| n.parse::<i64>().map_err(|_| format!("`seq {inner}`: only whole numbers are read")))
            .collect::<Result<_, _>>()?;
        let (a, b) = match nums.as_slice() {
            [b] => (1, *b),
            [a, b] => (*a, *b),
            _ => return Err(format!("`seq {inner}`: only `seq LAST` and `seq FIRST LAST` are read")),
        };
        let count = if b < a { 0 } else { b.saturating_sub(a).saturating_add(1) };
        if count > MAX_ITEMS as i64 {
            return Err(format!("a `for` loop of {count} iterations (more than {MAX_ITEMS} are not judged)"));
        }
        return Ok((a..=b).map(|n| n.to_string()).collect());
    }
    if items.len() > MAX_ITEMS {
        return Err(format!("a `for` loop of {} items (more than {MAX_ITEMS} are not judged)", items.len()));
    }
    match items.iter().find(|w| !plain(w)) {
        Some(odd) => Err(format!(
            "the loop item {odd:?} is not a plain word (letters, digits, `._+-`): its value cannot be known before it runs"
        )),
        None => Ok(items.iter().map(|w| (*w).to_owned()).collect()),
    }
}

/// `text` with `$name` and `${name}` replaced by `value` (a plain word).
/// Single-quoted text is left as it is, as bash does.
fn substitute(text: &str, name: &str, value: &str) -> String {
    let chars: Vec<char> = text.chars().collect();
    let mut out = String::with_capacity(text.len());
    let mut single = false;
    let mut i = 0;
    while i < chars.len() {
        let c = chars[i];
        if c == '\'' && !in_double(&chars, i) {
            single = !single;
        }
        if c == '\\' && !single {
            out.push(c);
            if let Some(n) = chars.get(i + 1) {
                out.push(*n);
            }
            i += 2;
            continue;
        }
        if c == '$' && !single {
            let rest: String = chars[i + 1..].iter().collect();
            let braced = format!("{{{name}}}");
            if rest.starts_with(&braced) {
                out.push_str(value);
                i += 1 + braced.chars().count();
                continue;
            }
            if rest.starts_with(name)
                && !rest[name.len()..].starts_with(|c: char| c.is_ascii_alphanumeric() || c == '_')
            {
                out.push_str(value);
                i += 1 + name.chars().count();
                continue;
            }
        }
        out.push(c);
        i += 1;
    }
    out
}

/// Whether `chars[at]` is inside double quotes (counting unescaped `"`
/// before it outside single quotes).
fn in_double(chars: &[char], at: usize) -> bool {
    let (mut single, mut double) = (false, false);
    let mut i = 0;
    while i < at {
        match chars[i] {
            '\\' if !single => i += 1,
            '\'' if !double => single = !single,
            '"' if !single => double = !double,
            _ => {}
        }
        i += 1;
    }
    double
}

#[cfg(test)]
mod tests {
    use super::*;

    fn kind(line: &str) -> (&'static str, bool) {
        let judged = judge(line);
        let k = match judged.class {
            Class::Plain => "plain",
            Class::Destructive { reach: Reach::Tree, .. } => "tree",
            Class::Destructive { reach: Reach::Beyond, .. } => "beyond",
            Class::Unclassifiable { .. } => "unknown",
        };
        (k, judged.noclobber)
    }

    #[test]
    fn a_build_loop_writing_new_files_is_a_write_under_noclobber() {
        for line in [
            "mkdir -p out && for i in $(seq 1 1000); do echo \"object $i\" > out/f$i.o; done",
            "for f in a b c; do echo hi > \"$f.txt\"; done",
            "for i in 1 2; do printf '%s\\n' x >> log/$i.txt 2>&1; done",
            "echo one > new.txt",
            "for i in $(seq 3); do touch t$i; done",
        ] {
            let expect_noclobber = line.contains('>') && !line.contains("touch");
            assert_eq!(kind(line), ("plain", expect_noclobber), "{line}");
        }
        // No redirection, no loop: exactly as before.
        assert_eq!(kind("ls -la"), ("plain", false));
        assert_eq!(kind("cat a 2>/dev/null"), ("plain", false));
    }

    #[test]
    fn what_cannot_be_judged_stays_unclassifiable_and_authority_stays_destructive() {
        for line in [
            "echo x >| f",
            "echo x > /etc/passwd",
            "echo x > ../f",
            "echo x > out/../../f",
            "echo x > $HOME/f",
            "cat <<EOF",
            "diff <(ls) f",
            "cd sub && echo x > f",
            "set +C; echo x > f",
            "set +o noclobber; echo x > f",
            "for i in $(ls); do echo x > $i; done",
            "for i in a*; do echo x > $i; done",
            "for i in 1 2; do echo $j > f$i; done",
            "for i in 1 2; do for j in 1 2; do touch $i$j; done; done",
            "for i in $(seq 1 100000); do touch f$i; done",
            "for i in 1 2; do rm -rf d$i; done > /dev/null",
            "echo x <> f",
            "echo x >& f",
            "for i in 1 2; do echo x > f$i",
        ] {
            let (k, _) = kind(line);
            assert!(k == "unknown" || k == "tree", "{line}: {k}");
            assert_ne!(k, "plain", "{line}");
        }
        for line in [
            "echo '#!/bin/sh' > .git/hooks/pre-commit",
            "for h in pre-commit post-checkout; do echo x > .git/hooks/$h; done",
            "echo '{}' > .mcp.json",
            "echo x >> .git/config",
            "echo x > .cairn/config.toml",
            "for i in 1 2; do rm -rf d$i; done",
        ] {
            assert_eq!(kind(line).0, "tree", "{line}");
        }
    }

    #[test]
    fn substitution_is_what_bash_does() {
        assert_eq!(substitute("echo \"$i ${i}\" '$i' $ix \\$i", "i", "7"), "echo \"7 7\" '$i' $ix \\$i");
    }
}
