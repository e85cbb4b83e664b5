//! Options through which a program runs another command (`git -c`,
//! `--upload-pack`, `rsync -e`, `tar --to-command`, `sed` scripts with `e`,
//! …): the one piece of shell-language knowledge the allowlist needs, so
//! that a pattern for a program never covers them ([`super::cmdline`]).
//! The shell tool's classifier (`cairn-tools`, `builtin/shell/classify.rs`)
//! reads the same function. It is pure and never runs anything.

/// The program name of a command word (`/usr/bin/git` → `git`).
pub fn base(word: &str) -> &str {
    word.rsplit('/').next().unwrap_or(word)
}

/// The index of git's subcommand in `args` (after its global options), or
/// `args.len()`.
fn git_subcommand(args: &[String]) -> usize {
    let mut j = 0;
    while let Some(w) = args.get(j) {
        match w.as_str() {
            "-C" | "-c" | "--git-dir" | "--work-tree" | "--namespace" | "--super-prefix" | "--list-cmds" => j += 2,
            w if w.starts_with('-') => j += 1,
            _ => return j,
        }
    }
    args.len()
}

/// Subcommand options through which git runs a command (`rest` are the
/// words after the subcommand `sub`; `None` for `sub` scans every word).
pub fn git_runs_command(sub: Option<&str>, rest: &[String]) -> Option<String> {
    let everywhere = ["--upload-pack", "--receive-pack", "--exec", "--extcmd", "--ext-diff", "--textconv"];
    let per_sub: &[&str] = match sub {
        Some("clone") => &["-u", "-c", "--config", "--template"],
        Some("init") => &["--template"],
        Some("ls-remote" | "fetch-pack" | "archive") => &["-u"],
        Some("rebase") => &["-x"],
        Some("difftool" | "mergetool") => &["-x", "--tool", "-t"],
        Some(_) => &[],
        None => &["-u", "-x", "--config", "--template", "--tool"],
    };
    rest.iter()
        .take_while(|w| *w != "--")
        .find(|w| {
            let w = w.as_str();
            everywhere.iter().chain(per_sub).any(|o| {
                w == *o
                    || w.strip_prefix(o).is_some_and(|r| r.starts_with('='))
                    || (o.len() == 2 && !o.starts_with("--") && w.starts_with(o) && !w.starts_with("--"))
            })
        })
        .cloned()
}

/// The option through which `command` (argv, command word first) would run
/// another command, if any: git's `-c`, `--upload-pack`-style options,
/// `--exec`, `rsync -e`, `tar --to-command`, `find -exec`, …. An allow
/// pattern for the program never covers these.
pub fn runs_other_commands(command: &[String]) -> Option<String> {
    let program = base(command.first()?);
    let args = &command[1..];
    let matches_any = |options: &[&str]| -> Option<String> {
        args.iter()
            .take_while(|w| *w != "--")
            .find(|w| {
                options.iter().any(|o| {
                    w.as_str() == *o
                        || w.strip_prefix(o).is_some_and(|r| r.starts_with('='))
                        || (o.len() == 2 && !o.starts_with("--") && w.starts_with(o) && !w.starts_with("--"))
                })
            })
            .cloned()
    };
    match program {
        "git" => {
            // Global options that set config or the exec path, then the
            // subcommand's own.
            let sub = git_subcommand(args);
            args[..sub]
                .iter()
                .find(|w| {
                    (w.starts_with("-c") && !w.starts_with("--"))
                        || w.starts_with("--config-env")
                        || w.starts_with("--exec-path")
                })
                .cloned()
                .or_else(|| {
                    git_runs_command(args.get(sub).map(String::as_str), args.get(sub + 1..).unwrap_or_default())
                })
        }
        "rsync" => matches_any(&["-e", "--rsh", "--rsync-path"]),
        "tar" => matches_any(&[
            "--to-command",
            "--use-compress-program",
            "-I",
            "--checkpoint-action",
            "--rsh-command",
            "--info-script",
            "--new-volume-script",
            "-F",
        ]),
        "scp" | "sftp" => matches_any(&["-S", "-o", "-J", "-F"]),
        "vi" | "vim" | "nvim" | "ex" | "view" => matches_any(&["-c", "--cmd", "-S"]),
        "less" | "more" | "man" => matches_any(&["-P", "--pager", "-H"]),
        "zip" => matches_any(&["-TT", "--unzip-command"]),
        "curl" | "wget" => matches_any(&["--use-askpass", "--execute", "-e"]),
        "sed" => args
            .iter()
            .any(|w| !w.starts_with('-') && sed_runs(w))
            .then(|| "a script with the `e` command or `w` file".to_owned()),
        _ => None,
    }
}

/// Whether a sed script may run a command (`e`, `s///e`) or write a file
/// (`w`): conservative, any such letter after a command separator or a
/// closing delimiter counts.
fn sed_runs(script: &str) -> bool {
    script.split([';', '\n']).any(|part| {
        let part = part.trim_start_matches(|c: char| c.is_ascii_digit() || matches!(c, ',' | '$' | ' ' | '!'));
        part.starts_with('e')
            || part.starts_with('w')
            || part.starts_with('W')
            || (part.starts_with('s') && part.len() > 1 && {
                let delim = part.chars().nth(1).unwrap_or('/');
                let flags = part.rsplit(delim).next().unwrap_or("");
                flags.contains('e') || flags.contains('w')
            })
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn options_that_run_commands_are_found_for_patterns() {
        // Argv written out by hand (not through the tokenizer it serves).
        let argv = |l: &str| -> Vec<String> {
            if l == "vim -c '!rm x' f" {
                return ["vim", "-c", "!rm x", "f"].map(String::from).to_vec();
            }
            l.split_whitespace().map(String::from).collect()
        };
        for line in [
            "git -c alias.x=!y x",
            "git -calias.x=!y x",
            "git fetch --upload-pack=x",
            "git --config-env=a=b status",
            "rsync -e x a b",
            "tar --to-command=x -xf a",
            "vim -c '!rm x' f",
        ] {
            assert!(runs_other_commands(&argv(line)).is_some(), "{line:?}");
        }
        for line in ["git status", "git log -p", "rsync -a a b", "tar -xf a.tar", "sed -n 1p f"] {
            assert!(runs_other_commands(&argv(line)).is_none(), "{line:?}");
        }
    }
}
