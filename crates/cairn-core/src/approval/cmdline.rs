//! A conservative parser for POSIX shell command lines, used only to decide
//! whether an allow pattern covers a command.
//!
//! It splits a line into simple commands (argv lists) separated by `;`,
//! newlines, `&&`, `||` and `|`, with quoting and escapes resolved. Any shape
//! whose effect cannot be read from the words alone is refused with a reason:
//! expansions (`$…`, `$(…)`, backticks, an unquoted `~` where bash expands
//! it, brace expansion `{a,b}`), redirections, subshells and groups,
//! background jobs, variable-assignment prefixes, shell keywords and
//! commands that run other commands (`env`, `sh -c`, `eval`, `xargs`, …).
//! The words it returns are the argv bash would run (globs aside: `*`, `?`
//! and `[…]` stay as written), which `tests/allowlist_bash.rs` checks
//! against a real bash.
//! A refused line is never approved by a pattern; it goes to a person.
//!
//! It must not try to be a full shell: when in doubt it refuses.

/// One simple command: the words after quote removal, command word first.
pub type SimpleCommand = Vec<String>;

/// Why a command line cannot be approved by a pattern.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct Unsafe(pub String);

/// Commands that run another command given as arguments (indirection): a
/// pattern can never see what they really run.
const INDIRECTION: &[&str] = &[
    "env",
    "sh",
    "bash",
    "zsh",
    "dash",
    "ksh",
    "mksh",
    "fish",
    "csh",
    "tcsh",
    "ash",
    "busybox",
    "eval",
    "exec",
    "xargs",
    "command",
    "builtin",
    "nohup",
    "sudo",
    "doas",
    "su",
    "time",
    "nice",
    "ionice",
    "timeout",
    "watch",
    "strace",
    "ltrace",
    "setsid",
    "stdbuf",
    "chroot",
    "unshare",
    "nsenter",
    "source",
    ".",
    "parallel",
    "script",
    "ssh",
    "flock",
    "trap",
    "run-parts",
    "perl",
    "python",
    "python3",
    "ruby",
    "node",
    "awk",
    "gawk",
];

/// Reserved words that start compound commands.
const KEYWORDS: &[&str] = &[
    "if", "then", "else", "elif", "fi", "for", "while", "until", "do", "done", "case", "esac", "function", "select",
    "coproc", "[[", "]]", "!", "{", "}", "in",
];

/// Split `line` into simple commands, or say why it cannot be judged by
/// its words.
pub fn parse(line: &str) -> Result<Vec<SimpleCommand>, Unsafe> {
    let commands = words(line)?;
    for command in &commands {
        check_simple(command)?;
    }
    Ok(commands)
}

/// Split `line` into simple commands after quote removal, without judging
/// the commands themselves (the tokenizer [`parse`] and
/// the shell tool's classifier share; it refuses expansions, redirections and
/// compound syntax, whose words are not the argv bash runs).
pub fn words(line: &str) -> Result<Vec<SimpleCommand>, Unsafe> {
    let mut commands: Vec<SimpleCommand> = Vec::new();
    let mut current: SimpleCommand = Vec::new();
    let mut word = String::new();
    let mut in_word = false;
    // The last character added to the word unquoted (tilde expansion
    // happens after an unquoted `=` or `:`), and whether the word has an
    // unquoted `{` (brace expansion needs an unquoted `{…}`).
    let mut last_unquoted: Option<char> = None;
    let mut open_brace = false;
    // Whether the word so far is an unquoted shell NAME (letters, digits,
    // `_`): bash reads `NAME[` as the start of an array subscript, inside
    // which blanks do not split words (`A[\t]` is one word to bash).
    let mut plain_name = true;
    let mut chars = line.chars().peekable();

    fn finish_word(word: &mut String, in_word: &mut bool, current: &mut SimpleCommand) {
        if *in_word {
            current.push(std::mem::take(word));
            *in_word = false;
        }
    }
    fn finish_command(current: &mut SimpleCommand, commands: &mut Vec<SimpleCommand>) -> Result<(), Unsafe> {
        if current.is_empty() {
            return Err(Unsafe("empty command between separators".to_owned()));
        }
        commands.push(std::mem::take(current));
        Ok(())
    }

    while let Some(c) = chars.next() {
        if !in_word {
            last_unquoted = None;
            open_brace = false;
            plain_name = true;
        }
        match c {
            ' ' | '\t' => finish_word(&mut word, &mut in_word, &mut current),
            '\n' | ';' => {
                finish_word(&mut word, &mut in_word, &mut current);
                if c == ';' && chars.peek() == Some(&';') {
                    return Err(Unsafe("`;;` (case syntax)".to_owned()));
                }
                if !current.is_empty() {
                    commands.push(std::mem::take(&mut current));
                } else if c == ';' {
                    return Err(Unsafe("empty command before `;`".to_owned()));
                }
            }
            '&' => {
                finish_word(&mut word, &mut in_word, &mut current);
                if chars.peek() == Some(&'&') {
                    chars.next();
                    finish_command(&mut current, &mut commands)?;
                } else {
                    return Err(Unsafe("`&` (background job or redirection)".to_owned()));
                }
            }
            '|' => {
                finish_word(&mut word, &mut in_word, &mut current);
                match chars.peek() {
                    Some('|') => {
                        chars.next();
                    }
                    Some('&') => return Err(Unsafe("`|&` (pipe with stderr)".to_owned())),
                    _ => {}
                }
                finish_command(&mut current, &mut commands)?;
            }
            '>' | '<' => return Err(Unsafe(format!("redirection `{c}`"))),
            '(' | ')' => return Err(Unsafe("subshell or process substitution".to_owned())),
            '`' => return Err(Unsafe("command substitution with backticks".to_owned())),
            '$' => return Err(Unsafe("expansion `$` (variable or command substitution)".to_owned())),
            '#' if !in_word => {
                // A comment runs to the end of the line.
                for next in chars.by_ref() {
                    if next == '\n' {
                        break;
                    }
                }
                finish_word(&mut word, &mut in_word, &mut current);
                if !current.is_empty() {
                    commands.push(std::mem::take(&mut current));
                }
            }
            '~' if !in_word || matches!(last_unquoted, Some('=' | ':')) => {
                return Err(Unsafe("tilde expansion `~` (write the path out, or quote the `~`)".to_owned()));
            }
            '}' if open_brace => {
                return Err(Unsafe("brace expansion `{…}` (quote the braces to keep them literal)".to_owned()));
            }
            '\\' => match chars.next() {
                Some('\n') => {}
                Some(escaped) => {
                    word.push(escaped);
                    in_word = true;
                    last_unquoted = None;
                    plain_name = false;
                }
                None => return Err(Unsafe("trailing backslash".to_owned())),
            },
            '\'' => {
                in_word = true;
                last_unquoted = None;
                plain_name = false;
                loop {
                    match chars.next() {
                        Some('\'') => break,
                        Some(inner) => word.push(inner),
                        None => return Err(Unsafe("unclosed single quote".to_owned())),
                    }
                }
            }
            '"' => {
                in_word = true;
                last_unquoted = None;
                plain_name = false;
                loop {
                    match chars.next() {
                        Some('"') => break,
                        Some('$') | Some('`') => {
                            return Err(Unsafe("expansion inside double quotes".to_owned()));
                        }
                        Some('\\') => match chars.next() {
                            // Inside double quotes a backslash escapes
                            // exactly these (and a newline).
                            Some(e @ ('"' | '\\' | '$' | '`')) => word.push(e),
                            Some('\n') => {}
                            Some(other) => {
                                word.push('\\');
                                word.push(other);
                            }
                            None => return Err(Unsafe("unclosed double quote".to_owned())),
                        },
                        Some(inner) => word.push(inner),
                        None => return Err(Unsafe("unclosed double quote".to_owned())),
                    }
                }
            }
            '[' if in_word && plain_name => {
                return Err(Unsafe("array subscript `NAME[…]` (quote the `[` to keep it literal)".to_owned()));
            }
            other => {
                word.push(other);
                in_word = true;
                last_unquoted = Some(other);
                open_brace |= other == '{';
                plain_name &= other.is_ascii_alphanumeric() || other == '_';
            }
        }
    }
    finish_word(&mut word, &mut in_word, &mut current);
    if !current.is_empty() {
        commands.push(current);
    } else if commands.is_empty() {
        return Err(Unsafe("empty command line".to_owned()));
    } else if line.trim_end().ends_with("&&") || line.trim_end().ends_with('|') {
        return Err(Unsafe("command line ends with an operator".to_owned()));
    }
    Ok(commands)
}

/// Refuse simple commands whose command word hides what runs.
fn check_simple(command: &SimpleCommand) -> Result<(), Unsafe> {
    let Some(first) = command.first() else {
        return Err(Unsafe("empty command".to_owned()));
    };
    if let Some((name, _)) = first.split_once('=')
        && !name.is_empty()
        && name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_')
    {
        return Err(Unsafe(format!("variable assignment `{first}` before the command")));
    }
    if KEYWORDS.contains(&first.as_str()) {
        return Err(Unsafe(format!("shell keyword `{first}`")));
    }
    let base = first.rsplit('/').next().unwrap_or(first);
    if INDIRECTION.contains(&base) {
        return Err(Unsafe(format!("`{base}` runs another command (indirection)")));
    }
    if base == "find"
        && command.iter().any(|w| matches!(w.as_str(), "-exec" | "-execdir" | "-ok" | "-okdir" | "-delete"))
    {
        return Err(Unsafe("`find` with -exec/-ok/-delete runs or deletes (indirection)".to_owned()));
    }
    // Options through which a program runs another command: a pattern for
    // the program never covers them.
    if let Some(option) = super::indirection::runs_other_commands(command) {
        return Err(Unsafe(format!("`{base}` with `{option}` can run another command (indirection)")));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn splits_simple_commands_with_quotes() {
        let parsed = parse(r#"ls -la 'my dir' "a b" c\ d && git status | wc -l"#).unwrap();
        assert_eq!(
            parsed,
            vec![
                vec!["ls", "-la", "my dir", "a b", "c d"].into_iter().map(String::from).collect::<Vec<_>>(),
                vec!["git".to_owned(), "status".to_owned()],
                vec!["wc".to_owned(), "-l".to_owned()],
            ]
        );
    }

    #[test]
    fn refuses_hidden_shapes() {
        for line in [
            "ls $(rm -rf ~)",
            "A[\t]",
            "ls x A[ ]=1",
            "ls `rm -rf ~`",
            "ls > /etc/passwd",
            "ls &",
            "(rm -rf ~)",
            "env rm -rf ~",
            "sh -c 'rm -rf ~'",
            "/bin/bash -c ls",
            "eval ls",
            "FOO=1 ls",
            "ls \"$HOME\"",
            "ls 'unclosed",
            "",
            "; ls",
            "ls ;; rm",
            "ls ~",
            "ls ~root/.ssh",
            "ls x=~/y",
            "ls --dir=a:~",
            "ls {a,b}",
            "ls src/{..,x}/secret",
            "{rm,-rf,x}",
        ] {
            assert!(parse(line).is_err(), "{line:?} should be refused");
        }
    }

    #[test]
    fn words_are_what_bash_passes() {
        // Expected argv as bash gives it (checked by hand with
        // `printf '<%s>' …`); tests/allowlist_bash.rs checks with bash itself.
        let cases: [(&str, &[&str]); 6] = [
            (r#"ls "\$" "\`" "\"" "\\" "\a""#, &["ls", "$", "`", "\"", "\\", "\\a"]),
            ("ls a~ HEAD~3 '~' \\~ ''~", &["ls", "a~", "HEAD~3", "~", "~", "~"]),
            ("ls '{a,b}' \\{a,b} {a a} {", &["ls", "{a,b}", "{a,b}", "{a", "a}", "{"]),
            ("ls a\\\n#b #c", &["ls", "a#b"]),
            ("l\\\ns -l", &["ls", "-l"]),
            ("ls x=a", &["ls", "x=a"]),
        ];
        for (line, argv) in cases {
            assert_eq!(parse(line).unwrap(), vec![argv.iter().map(|w| w.to_string()).collect::<Vec<_>>()], "{line:?}");
        }
    }
}
