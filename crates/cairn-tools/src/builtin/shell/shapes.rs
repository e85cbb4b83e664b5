//! The table of command shapes the shell classifier knows ([`RULES`]):
//! which programs, spelled how, are Destructive on the working tree,
//! Destructive beyond it, or Unclassifiable, and why — overwriting programs
//! (anything that can replace an existing file), archive extraction,
//! patching, git's subcommands (every one reads the repository's
//! configuration, which a tool can write), deleting, disk and power tools.
//! docs/tools.md quotes this table as [`markdown`] renders it (a unit test
//! holds them equal), and every row carries example lines a test
//! classifies.
//!
//! It owns the data and how a row matches a command's words; it must not
//! parse shell syntax nor see through wrappers (`classify.rs` does, then
//! asks [`class_of`] / [`git_class`]). Pure: it never runs anything.

/// What a row makes a command.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    /// Destructive on files under the working tree (a staged run shows it).
    Tree,
    /// Destructive beyond the tree (remotes, other machines, disks, the
    /// machine itself).
    Beyond,
    /// Its effect cannot be read from its words.
    Unclassifiable,
}

impl Verdict {
    fn label(self) -> &'static str {
        match self {
            Verdict::Tree => "Destructive (tree)",
            Verdict::Beyond => "Destructive (beyond)",
            Verdict::Unclassifiable => "Unclassifiable",
        }
    }
}

/// The words a row looks at: a program's arguments, or for git rows the
/// subcommand and its arguments (for `git` rows, the global options).
#[derive(Debug, Clone, Copy)]
pub struct Words<'a> {
    /// git's subcommand (`None` elsewhere, or when git has none).
    pub sub: Option<&'a str>,
    /// The words after the program name (git: after the subcommand; for a
    /// `git` row, git's global options).
    pub args: &'a [String],
}

/// One shape.
#[derive(Debug)]
pub struct Rule {
    /// Program base names (`tee`), `git SUB` for a git subcommand, `git`
    /// for git's global options, `git *` for any git command no `git SUB`
    /// or `git` row matched, and `*` for every program.
    pub names: &'static [&'static str],
    /// When the row holds, in words (the docs' column).
    pub when: &'static str,
    /// Whether it holds.
    pub holds: fn(Words<'_>) -> bool,
    /// What the command is then.
    pub verdict: Verdict,
    /// Why, after the command's name (shown to the person asked).
    pub why: &'static str,
    /// Lines that match this row and no worse one (tested).
    pub examples: &'static [&'static str],
}

// ---------------------------------------------------------------------
// Matching helpers. Over-matching only makes a line stricter, so the
// helpers that make a row hold are generous; the ones that exempt a line
// (no-clobber, dry run, listing) accept only unambiguous spellings.

/// Option words before `--`.
fn option_words(args: &[String]) -> impl Iterator<Item = &str> {
    args.iter().map(String::as_str).take_while(|w| *w != "--").filter(|w| w.starts_with('-') && w.len() > 1)
}

/// Whether one of `names` is given: `-x` as the letter anywhere in a short
/// cluster (`-vx`, also where it may be another option's value), `--name`
/// as itself, `--name=…`, or an abbreviation getopt would accept (`--out`
/// for `--output`).
fn given(args: &[String], names: &[&str]) -> bool {
    option_words(args).any(|w| match w.strip_prefix("--") {
        Some(long) => {
            let name = long.split('=').next().unwrap_or(long);
            !name.is_empty()
                && names.iter().filter_map(|n| n.strip_prefix("--")).any(|n| n == long || n.starts_with(name))
        }
        None => names.iter().filter(|n| !n.starts_with("--")).any(|n| w[1..].contains(&n[1..])),
    })
}

/// Whether one of `names` is given for certain, for the exemptions: a long
/// option exactly (`--no-clobber`; a name ending in `=` also with its
/// value), a short one as its own word or in a cluster of `flags` (letters
/// that take no value, so none of them can swallow the rest).
fn surely(args: &[String], names: &[&str], flags: &str) -> bool {
    option_words(args).any(|w| {
        names.iter().any(|n| {
            if n.starts_with("--") {
                w == *n || (n.ends_with('=') && w.starts_with(n))
            } else {
                let letter = n.chars().nth(1).unwrap_or('-');
                !w.starts_with("--")
                    && w[1..].contains(letter)
                    && w[1..].chars().all(|c| c == letter || flags.contains(c))
            }
        })
    })
}

/// Operands: words that are not options, skipping the separate values of
/// `with_value` options (everything after `--` is an operand).
fn operands<'a>(args: &'a [String], with_value: &[&str]) -> Vec<&'a str> {
    let mut out = Vec::new();
    let mut j = 0;
    let mut dashdash = false;
    while let Some(w) = args.get(j) {
        let w = w.as_str();
        if dashdash || !w.starts_with('-') || w == "-" {
            out.push(w);
        } else if w == "--" {
            dashdash = true;
        } else if with_value.contains(&w) {
            j += 1;
        }
        j += 1;
    }
    out
}

/// Files whose writing destroys nothing.
fn harmless_target(path: &str) -> bool {
    matches!(path, "-" | "/dev/null" | "/dev/stdout" | "/dev/stderr" | "/dev/tty")
}

/// A host-qualified operand (`host:path`, `user@host:path`, `rsync://…`).
fn remote(operand: &str) -> bool {
    operand.contains("://") || operand.split_once(':').is_some_and(|(host, _)| !host.is_empty() && !host.contains('/'))
}

/// tar's mode letters and long modes that write: extract, or change an
/// archive file.
fn tar_mode(args: &[String], letters: &str, long: &[&str]) -> bool {
    let old_style = args.first().is_some_and(|w| !w.starts_with('-') && w.chars().any(|c| letters.contains(c)));
    old_style
        || option_words(args).any(|w| match w.strip_prefix("--") {
            Some(l) => {
                let name = l.split('=').next().unwrap_or(l);
                !name.is_empty() && long.iter().any(|m| m.starts_with(name))
            }
            None => w[1..].chars().any(|c| letters.contains(c)),
        })
}

/// Whether tar names an archive file other than stdout (`-f FILE`, `-fFILE`,
/// `--file=FILE`, old-style `cf FILE`).
fn tar_writes_a_file(args: &[String]) -> bool {
    let mut j = 0;
    while let Some(w) = args.get(j) {
        let w = w.as_str();
        if w == "--" {
            break;
        }
        let cluster =
            if j == 0 && !w.starts_with('-') { Some(w) } else { w.strip_prefix('-').filter(|c| !c.starts_with('-')) };
        if let Some(value) = w.strip_prefix("--file=") {
            return !harmless_target(value);
        }
        if w == "--file" {
            return args.get(j + 1).is_none_or(|v| !harmless_target(v));
        }
        if let Some(c) = cluster
            && let Some(at) = c.find('f')
        {
            let attached = &c[at + 1..];
            if !attached.is_empty() && w.starts_with('-') {
                return !harmless_target(attached);
            }
            return args.get(j + 1).is_none_or(|v| !harmless_target(v));
        }
        j += 1;
    }
    false
}

/// The first operand, a mode word (`7z x`, `ar rcs`, `git stash pop`).
fn first_operand(args: &[String]) -> Option<&str> {
    args.iter().map(String::as_str).find(|w| !w.starts_with('-'))
}

/// The key of `ar`/`jar` (first word, dash optional).
fn key(args: &[String]) -> &str {
    args.first().map_or("", |w| w.trim_start_matches('-'))
}

/// Whether git's subcommand is one git has (a word that is none names an
/// alias, which the repository's configuration defines, or a `git-…`
/// program).
pub fn git_knows(sub: &str) -> bool {
    GIT_COMMANDS.contains(&sub)
}

/// git 2.47's commands (`git --list-cmds=main,nohelpers`), and `stage`.
const GIT_COMMANDS: &[&str] = &[
    "add",
    "am",
    "annotate",
    "apply",
    "archimport",
    "archive",
    "bisect",
    "blame",
    "branch",
    "bugreport",
    "bundle",
    "cat-file",
    "check-attr",
    "check-ignore",
    "check-mailmap",
    "check-ref-format",
    "checkout",
    "checkout-index",
    "cherry",
    "cherry-pick",
    "clean",
    "clone",
    "column",
    "commit",
    "commit-graph",
    "commit-tree",
    "config",
    "count-objects",
    "credential",
    "credential-cache",
    "credential-store",
    "cvsexportcommit",
    "cvsimport",
    "cvsserver",
    "daemon",
    "describe",
    "diagnose",
    "diff",
    "diff-files",
    "diff-index",
    "diff-tree",
    "difftool",
    "fast-export",
    "fast-import",
    "fetch",
    "fetch-pack",
    "filter-branch",
    "fmt-merge-msg",
    "for-each-ref",
    "for-each-repo",
    "format-patch",
    "fsck",
    "fsck-objects",
    "gc",
    "get-tar-commit-id",
    "grep",
    "hash-object",
    "help",
    "hook",
    "http-backend",
    "http-fetch",
    "http-push",
    "imap-send",
    "index-pack",
    "init",
    "init-db",
    "instaweb",
    "interpret-trailers",
    "log",
    "ls-files",
    "ls-remote",
    "ls-tree",
    "mailinfo",
    "mailsplit",
    "maintenance",
    "merge",
    "merge-base",
    "merge-file",
    "merge-index",
    "merge-octopus",
    "merge-one-file",
    "merge-ours",
    "merge-recursive",
    "merge-recursive-ours",
    "merge-recursive-theirs",
    "merge-resolve",
    "merge-subtree",
    "merge-tree",
    "mergetool",
    "mktag",
    "mktree",
    "multi-pack-index",
    "mv",
    "name-rev",
    "notes",
    "p4",
    "pack-objects",
    "pack-redundant",
    "pack-refs",
    "patch-id",
    "prune",
    "prune-packed",
    "pull",
    "push",
    "quiltimport",
    "range-diff",
    "read-tree",
    "rebase",
    "receive-pack",
    "reflog",
    "refs",
    "remote",
    "repack",
    "replace",
    "replay",
    "request-pull",
    "rerere",
    "reset",
    "restore",
    "rev-list",
    "rev-parse",
    "revert",
    "rm",
    "send-email",
    "send-pack",
    "shell",
    "shortlog",
    "show",
    "show-branch",
    "show-index",
    "show-ref",
    "sparse-checkout",
    "stage",
    "stash",
    "status",
    "stripspace",
    "submodule",
    "svn",
    "switch",
    "symbolic-ref",
    "tag",
    "unpack-file",
    "unpack-objects",
    "update-index",
    "update-ref",
    "update-server-info",
    "upload-archive",
    "upload-pack",
    "var",
    "verify-commit",
    "verify-pack",
    "verify-tag",
    "version",
    "whatchanged",
    "worktree",
    "write-tree",
    "filter-repo",
];

/// Config keys `git -c` may set without making git run a command.
const GIT_SAFE_CONFIG: &[&str] = &[
    "user.name",
    "user.email",
    "color.",
    "core.quotepath",
    "advice.",
    "init.defaultbranch",
    "safe.directory",
    "core.autocrlf",
    "core.safecrlf",
    "pull.rebase",
    "pull.ff",
    "merge.ff",
    "format.",
    "column.",
    "i18n.",
    "status.",
    "diff.renames",
    "diff.mnemonicprefix",
    "core.abbrev",
    "core.filemode",
    "core.ignorecase",
    "fetch.prune",
    "push.default",
    "credential.interactive",
];

/// Whether a `git -c key=value` may make git run a command (every key but
/// the few known inert: `alias.*`, `core.fsmonitor`, `core.pager`,
/// `core.sshCommand`, drivers, `include.path`, `gpg.program`, … do).
fn git_config_runs(kv: &str) -> bool {
    let key = kv.split_once('=').map_or(kv, |(k, _)| k).to_ascii_lowercase();
    !GIT_SAFE_CONFIG.iter().any(|safe| if safe.ends_with('.') { key.starts_with(safe) } else { key == *safe })
}

/// git's global options that set configuration or the exec path.
fn git_global_configures(args: &[String]) -> bool {
    let mut j = 0;
    while let Some(w) = args.get(j) {
        let w = w.as_str();
        if w == "-c" {
            if args.get(j + 1).is_none_or(|kv| git_config_runs(kv)) {
                return true;
            }
            j += 1;
        } else if let Some(kv) = w.strip_prefix("-c").filter(|_| !w.starts_with("--")) {
            if git_config_runs(kv) {
                return true;
            }
        } else if w.starts_with("--config-env") || w.starts_with("--exec-path=") {
            return true;
        }
        j += 1;
    }
    false
}

/// `git config` forms that change configuration (a value, `--unset`,
/// `--add`, `--edit`, the `set`/`unset`/… subcommands); reading forms
/// (`--get`, `--list`, `get`, one operand) do not.
fn git_config_writes(args: &[String]) -> bool {
    const WRITING: &[&str] =
        &["--unset", "--unset-all", "--add", "--replace-all", "--rename-section", "--remove-section", "-e", "--edit"];
    const READING: &[&str] =
        &["--get", "--get-all", "--get-regexp", "--get-urlmatch", "--get-color", "--get-colorbool", "-l", "--list"];
    if given(args, WRITING) {
        return true;
    }
    let ops = operands(args, &["-f", "--file", "--blob", "--type", "-t", "--default", "--comment", "--value"]);
    match ops.first().copied() {
        Some("set" | "unset" | "rename-section" | "remove-section" | "edit") => true,
        Some("get" | "list") => false,
        _ if surely(args, READING, "z") => false,
        _ => ops.len() >= 2,
    }
}

fn git_config_elsewhere(args: &[String]) -> bool {
    git_config_writes(args) && given(args, &["--global", "--system", "-f", "--file", "--blob"])
}

// ---------------------------------------------------------------------

/// Every shape the classifier knows, worst first within a program.
pub const RULES: &[Rule] = &[
    // Overwriting programs: anything that can replace or rewrite an
    // existing file. The words cannot tell whether the target exists.
    Rule {
        names: &["tee", "sponge"],
        when: "a file operand other than `/dev/null`, `/dev/stdout`, `/dev/stderr`, without `-a`",
        holds: |w| {
            !surely(w.args, &["-a", "--append"], "aip") && operands(w.args, &[]).iter().any(|f| !harmless_target(f))
        },
        verdict: Verdict::Tree,
        why: "truncates and rewrites the files it is given",
        examples: &["tee a.txt", "echo x | tee -i a.txt b.txt", "sponge a.txt", "/usr/bin/tee --output-error a"],
    },
    Rule {
        names: &["sort", "shuf", "iconv"],
        when: "`-o FILE`, `--output=FILE` (or an abbreviation)",
        holds: |w| given(w.args, &["-o", "--output"]),
        verdict: Verdict::Tree,
        why: "writes its output over the file named by -o",
        examples: &[
            "sort -o a.txt b.txt",
            "sort --output=a.txt b",
            "sort --outp=a.txt b",
            "sort -uo a.txt b",
            "sort -oa.txt b",
        ],
    },
    Rule {
        names: &["uniq", "xxd"],
        when: "a second operand (the output file)",
        holds: |w| operands(w.args, &["-f", "-s", "-w", "--skip-fields", "--skip-chars", "--check-chars"]).len() >= 2,
        verdict: Verdict::Tree,
        why: "writes over its second operand (the output file)",
        examples: &["uniq b.txt a.txt", "uniq -c in out", "xxd -r dump a.bin"],
    },
    Rule {
        names: &["cp", "mv"],
        when: "unless `-n`, `--no-clobber` or `--update=none` without `-f`, `-i`, `-u`, `-b`, `--remove-destination`",
        holds: |w| {
            let no_clobber =
                surely(w.args, &["-n", "--no-clobber", "--update=none", "--update=none-fail"], "vaprRdlLPsxHT");
            let again = given(
                w.args,
                &["-f", "-i", "-u", "-b", "--force", "--interactive", "--remove-destination", "--backup"],
            ) || option_words(w.args).any(|o| o.starts_with("--update") && !o.starts_with("--update=none"));
            !no_clobber || again
        },
        verdict: Verdict::Tree,
        why: "replaces its target if it exists (the words cannot tell whether it does; `-n` never replaces)",
        examples: &[
            "cp /dev/null a.txt",
            "mv b.txt a.txt",
            "cp -f a b",
            "cp -r dir out",
            "cp -tn dir a",
            "mv -n -f a b",
            "cp --update=all a b",
            "mv x /dev/null",
        ],
    },
    Rule {
        names: &["install", "ginstall"],
        when: "unless `-d` (directories only)",
        holds: |w| !surely(w.args, &["-d", "--directory"], "vpDC"),
        verdict: Verdict::Tree,
        why: "replaces its target file",
        examples: &["install -m 644 /dev/null a.txt", "install b a", "install -D x out/y"],
    },
    Rule {
        names: &["ln"],
        when: "`-f`, `--force`, `-i`, `-b`, `--backup`",
        holds: |w| given(w.args, &["-f", "-i", "-b", "--force", "--interactive", "--backup", "-S", "--suffix"]),
        verdict: Verdict::Tree,
        why: "replaces an existing target with a link",
        examples: &["ln -sf b.txt a.txt", "ln -fs b a", "ln --force -s b a", "ln -sfn b a"],
    },
    Rule {
        names: &["rsync", "scp"],
        when: "an operand on another host (`host:path`, `rsync://`)",
        holds: |w| {
            operands(w.args, &["-e", "--rsh", "-B", "-T", "-f", "-M", "-i", "-o", "-P", "-F", "-J", "-l", "-c", "-S"])
                .iter()
                .any(|o| remote(o))
        },
        verdict: Verdict::Beyond,
        why: "copies to or from another machine",
        examples: &["rsync -a src host:dst", "scp a.txt user@host:/tmp/x", "rsync rsync://h/m/ out"],
    },
    Rule {
        names: &["rsync", "scp"],
        when: "unless `-n`, `--dry-run`, `--list-only`",
        holds: |w| !surely(w.args, &["-n", "--dry-run", "--list-only"], "avrlptgoDzhPqcuxHAXSWRLkKibI"),
        verdict: Verdict::Tree,
        why: "replaces files at its destination (and with --delete removes others)",
        examples: &["rsync b.txt a.txt", "rsync -a --delete src/ dst/", "scp b a"],
    },
    Rule {
        names: &["dd"],
        when: "`of=` a device other than `/dev/null`, `/dev/stdout`, `/dev/stderr`",
        holds: |w| {
            w.args.iter().filter_map(|a| a.strip_prefix("of=")).any(|t| t.starts_with("/dev/") && !harmless_target(t))
        },
        verdict: Verdict::Beyond,
        why: "writes a device",
        examples: &["dd if=/dev/zero of=/dev/sda", "dd of=/dev/nvme0n1 if=x"],
    },
    Rule {
        names: &["dd"],
        when: "`of=FILE`",
        holds: |w| w.args.iter().filter_map(|a| a.strip_prefix("of=")).any(|t| !harmless_target(t)),
        verdict: Verdict::Tree,
        why: "overwrites the file named by of=",
        examples: &["dd if=/dev/zero of=a.txt bs=1 count=1", "dd if=b of=a conv=notrunc"],
    },
    Rule {
        names: &["truncate"],
        when: "always",
        holds: |_| true,
        verdict: Verdict::Tree,
        why: "cuts files",
        examples: &["truncate -s 0 a.txt", "truncate --size=2 f"],
    },
    Rule {
        names: &["shred", "wipe"],
        when: "always",
        holds: |_| true,
        verdict: Verdict::Tree,
        why: "destroys file contents",
        examples: &["shred -u f", "wipe -f x"],
    },
    Rule {
        names: &["fallocate"],
        when: "`-p`, `-c`, `-z`, `-i` (punch, collapse, zero or insert a range)",
        holds: |w| {
            given(
                w.args,
                &[
                    "-p",
                    "-c",
                    "-z",
                    "-i",
                    "--punch-hole",
                    "--collapse-range",
                    "--zero-range",
                    "--insert-range",
                    "--dig-holes",
                ],
            )
        },
        verdict: Verdict::Tree,
        why: "rewrites a file's bytes in place",
        examples: &["fallocate -p -o 0 -l 4096 a.bin", "fallocate --zero-range -l 1 f"],
    },
    Rule {
        names: &["sed", "gsed"],
        when: "`-f FILE`, `--file=FILE` (a script in a file)",
        holds: |w| given(w.args, &["-f", "--file"]),
        verdict: Verdict::Unclassifiable,
        why: "runs a script from a file, which may run commands (`e`) or write files (`w`) its words do not show",
        examples: &["sed -f x.sed a.txt", "sed -nf x.sed a", "sed --file=x.sed a"],
    },
    Rule {
        names: &["sed", "gsed"],
        when: "`-i`, `--in-place`",
        holds: |w| given(w.args, &["-i", "--in-place"]),
        verdict: Verdict::Tree,
        why: "rewrites its files in place",
        examples: &["sed -i d a.txt", "sed -i.bak 's/a/b/' f", "sed -ni p f", "sed --in-place=.orig 1d f"],
    },
    Rule {
        names: &["split", "csplit"],
        when: "always",
        holds: |_| true,
        verdict: Verdict::Tree,
        why: "writes its pieces over existing files (xaa…, xx00…)",
        examples: &["split -l 10 a.txt", "csplit a.txt 3"],
    },
    Rule {
        names: &["curl"],
        when: "`-o`, `-O`, `--output`, `--remote-name`, `-D`, `-c` (files it writes)",
        holds: |w| {
            given(
                w.args,
                &[
                    "-o",
                    "-O",
                    "-D",
                    "-c",
                    "--output",
                    "--remote-name",
                    "--remote-name-all",
                    "--dump-header",
                    "--cookie-jar",
                    "--trace",
                    "--trace-ascii",
                    "--stderr",
                    "--etag-save",
                ],
            )
        },
        verdict: Verdict::Tree,
        why: "writes what it fetches over the files it names",
        examples: &["curl -o a.txt http://x/", "curl -sSLO http://x/a.txt"],
    },
    Rule {
        names: &["wget"],
        when: "`-O`, `-o`, `-N`, `-r`, `-m`, `-p` (files it overwrites)",
        holds: |w| {
            given(
                w.args,
                &[
                    "-O",
                    "-o",
                    "-N",
                    "-r",
                    "-m",
                    "-p",
                    "--output-document",
                    "--output-file",
                    "--timestamping",
                    "--recursive",
                    "--mirror",
                    "--page-requisites",
                ],
            )
        },
        verdict: Verdict::Tree,
        why: "writes what it fetches over the files it names",
        examples: &["wget -O a.txt http://x/", "wget -r http://x/"],
    },
    Rule {
        names: &["openssl"],
        when: "`-out FILE`",
        holds: |w| w.args.iter().any(|a| a == "-out" || a.starts_with("-out=")),
        verdict: Verdict::Tree,
        why: "writes over the file named by -out",
        examples: &["openssl enc -in b -out a.txt"],
    },
    Rule {
        names: &["*"],
        when: "any program given `--output=FILE`, `--output FILE`, `--output-file`, `--output-document`, `--outfile`, `--out-file`",
        holds: |w| {
            option_words(w.args).any(|o| {
                let name = o.split('=').next().unwrap_or(o);
                matches!(name, "--output" | "--output-file" | "--output-document" | "--outfile" | "--out-file")
            })
        },
        verdict: Verdict::Tree,
        why: "writes over the file named by --output",
        examples: &["pandoc --output=a.txt b.md", "git diff --output=a.txt", "gpg --output a.txt -d b"],
    },
    // Archive extraction: writes and replaces whatever files the archive
    // holds, which the line does not show.
    Rule {
        names: &["tar", "gtar", "bsdtar"],
        when: "extracting: `x`, `-x`, `--extract`, `--get`",
        holds: |w| tar_mode(w.args, "x", &["extract", "get"]),
        verdict: Verdict::Tree,
        why: "extracts an archive: writes and replaces the files it holds, which its words do not show",
        examples: &[
            "tar xf evil.tar",
            "tar -xzf a.tgz",
            "tar --extract -f a.tar",
            "tar --ext -f a",
            "busybox tar x -f a.tar",
        ],
    },
    Rule {
        names: &["tar", "gtar", "bsdtar"],
        when: "creating or changing an archive file (`c`, `r`, `u`, `A`, `--delete`) named by `-f`, or `--remove-files`",
        holds: |w| {
            given(w.args, &["--remove-files"])
                || (tar_mode(w.args, "cruA", &["create", "append", "update", "catenate", "concatenate", "delete"])
                    && tar_writes_a_file(w.args))
        },
        verdict: Verdict::Tree,
        why: "writes over its archive file (or deletes what it archived)",
        examples: &[
            "tar cf a.txt src",
            "tar -czf out.tgz src",
            "tar -cf /dev/null --remove-files src",
            "tar --create --file=a.tar x",
        ],
    },
    Rule {
        names: &["unzip", "bsdunzip"],
        when: "unless listing or testing (`-l`, `-v`, `-t`, `-Z`) or printing (`-p`, `-c`, `-z`)",
        holds: |w| !surely(w.args, &["-l", "-v", "-t", "-Z", "-p", "-c", "-z"], "lvtZpczqa"),
        verdict: Verdict::Tree,
        why: "extracts an archive: writes and replaces the files it holds, which its words do not show",
        examples: &["unzip -o evil.zip", "unzip a.zip", "unzip -qo a.zip -d out"],
    },
    Rule {
        names: &["7z", "7za", "7zr", "7zz", "unrar", "rar"],
        when: "unless the mode is listing or testing (`l`, `t`, `i`, `h`, `b`, `v`, `lt`, `lb`)",
        holds: |w| {
            !matches!(
                first_operand(w.args),
                Some("l" | "t" | "i" | "h" | "b" | "v" | "lt" | "lta" | "lb" | "vt" | "vta" | "vb")
            )
        },
        verdict: Verdict::Tree,
        why: "extracts or rewrites an archive: writes and replaces the files it holds",
        examples: &["7z x a.7z", "7z e -y a.7z", "unrar x a.rar"],
    },
    Rule {
        names: &["cpio", "pax"],
        when: "unless listing (`-t`, `--list`; pax without `-r`/`-w`)",
        holds: |w| {
            if w.args.is_empty() {
                return false;
            }
            let listing = surely(w.args, &["-t", "--list"], "ivn");
            !listing
                && (given(w.args, &["-i", "-p", "-r", "-w", "--extract", "--pass-through"])
                    || !given(w.args, &["-o", "--create"]))
        },
        verdict: Verdict::Tree,
        why: "extracts an archive (or copies a tree): writes and replaces the files it holds",
        examples: &["cpio -idv", "cpio -pdm out", "pax -r -f a.pax"],
    },
    Rule {
        names: &["ar", "jar"],
        when: "a key that extracts or writes (`x`, `r`, `q`, `d`, `m`, `c`, `u`), not only `t`/`p`",
        holds: |w| !w.args.is_empty() && key(w.args).chars().any(|c| "xrqdmcui".contains(c)),
        verdict: Verdict::Tree,
        why: "extracts or rewrites an archive: writes and replaces the files it holds",
        examples: &["ar x lib.a", "ar rcs lib.a a.o", "jar xf a.jar"],
    },
    Rule {
        names: &[
            "gzip",
            "gunzip",
            "bzip2",
            "bunzip2",
            "xz",
            "unxz",
            "lzma",
            "unlzma",
            "zstd",
            "unzstd",
            "lz4",
            "lzip",
            "pigz",
            "unpigz",
            "compress",
            "uncompress",
            "brotli",
        ],
        when: "file operands, unless `-c`/`--stdout`, `-l`, `-t`",
        holds: |w| {
            !surely(w.args, &["-c", "--stdout", "--to-stdout", "-l", "--list", "-t", "--test"], "dkqvfnN123456789")
                && !operands(w.args, &["-S", "--suffix", "-o", "-T", "-b"]).is_empty()
        },
        verdict: Verdict::Tree,
        why: "replaces files by their compressed or decompressed forms (with -f, over existing ones)",
        examples: &["gunzip -f a.txt.gz", "gzip a.txt", "zstd -d -o a.txt a.zst"],
    },
    // Patching: changes, creates and deletes whatever files the patch
    // names.
    Rule {
        names: &["patch"],
        when: "unless `--dry-run`",
        holds: |w| !surely(w.args, &["--dry-run", "--check"], ""),
        verdict: Verdict::Tree,
        why: "applies a patch: changes, creates and deletes the files the patch names, which its words do not show",
        examples: &["patch -i evil.patch", "patch -p1 -i x.diff", "patch a.txt x.diff"],
    },
    Rule {
        names: &["ed", "ex", "red"],
        when: "always (commands come from stdin)",
        holds: |_| true,
        verdict: Verdict::Unclassifiable,
        why: "edits files with commands from its input (including `!` shell commands and `w`), which its words do not show",
        examples: &["ed -s a.txt", "ex a.txt"],
    },
    // Deleting.
    Rule {
        names: &["rm"],
        when: "`-r`, `-R`, `--recursive`",
        holds: |w| given(w.args, &["-r", "-R", "--recursive"]),
        verdict: Verdict::Tree,
        why: "deletes recursively",
        examples: &["rm -rf x", "rm -r -f x", "rm --recursive x", "/bin/rm -fr x"],
    },
    Rule {
        names: &["chmod", "chown", "chgrp"],
        when: "`-R`, `--recursive`",
        holds: |w| given(w.args, &["-R", "--recursive"]),
        verdict: Verdict::Tree,
        why: "changes a whole tree recursively",
        examples: &["chmod -R 000 x", "chown --recursive nobody x"],
    },
    // Processes, disks and the machine.
    Rule {
        names: &["kill", "killall", "pkill"],
        when: "`-1` or `1` (every process, or init)",
        holds: |w| w.args.iter().any(|a| a == "-1" || a == "1"),
        verdict: Verdict::Beyond,
        why: "signals every process",
        examples: &["kill -9 -1", "kill 1"],
    },
    Rule {
        names: &["killall5"],
        when: "always",
        holds: |_| true,
        verdict: Verdict::Beyond,
        why: "signals every process",
        examples: &["killall5 -9"],
    },
    Rule {
        names: &["systemctl"],
        when: "`poweroff`, `reboot`, `halt`, `kexec`, `suspend`, `hibernate`, `rescue`, `emergency`",
        holds: |w| {
            w.args.iter().any(|a| {
                matches!(
                    a.as_str(),
                    "poweroff" | "reboot" | "halt" | "kexec" | "suspend" | "hibernate" | "rescue" | "emergency"
                )
            })
        },
        verdict: Verdict::Beyond,
        why: "stops the machine",
        examples: &["systemctl poweroff"],
    },
    Rule {
        names: &["shutdown", "reboot", "halt", "poweroff", "telinit", "kexec"],
        when: "always",
        holds: |_| true,
        verdict: Verdict::Beyond,
        why: "stops the machine",
        examples: &["shutdown -h now", "reboot"],
    },
    Rule {
        names: &[
            "mkfs*",
            "mke2fs*",
            "fdisk",
            "sfdisk",
            "gdisk",
            "sgdisk",
            "cfdisk",
            "parted",
            "wipefs",
            "blkdiscard",
            "mkswap",
            "cryptsetup",
            "losetup",
            "hdparm",
            "nvme",
            "zpool",
            "mdadm",
            "lvremove",
            "vgremove",
            "pvremove",
        ],
        when: "always",
        holds: |_| true,
        verdict: Verdict::Beyond,
        why: "rewrites disks or file systems",
        examples: &["mkfs.ext4 /dev/sdb1", "wipefs -a /dev/sdb", "mkfs /dev/sdb"],
    },
    // git. Every git command reads the repository's configuration, which a
    // tool can write (`git config`, an edit of `.git/config`), and runs
    // the programs it names; rows naming a subcommand say what more it
    // does, the `git *` rows hold for every other git command.
    Rule {
        names: &["git"],
        when: "`-c KEY=…` with a key not known inert, `--config-env`, `--exec-path=`",
        holds: |w| git_global_configures(w.args),
        verdict: Verdict::Unclassifiable,
        why: "sets configuration for this run that can make git run another program (`core.fsmonitor`, `alias.*`, `core.pager`, `core.sshCommand`, drivers, `include.path`)",
        examples: &[
            "git -c core.fsmonitor='touch MARK' status",
            "git -c alias.x='!rm a' x",
            "git --exec-path=/tmp/x status",
            "git -ccore.pager=x log",
        ],
    },
    Rule {
        names: &["git push"],
        when: "`-f`, `--force*`, `--mirror`, `-d`, `--delete`, `--prune`, a `+` or `:` refspec",
        holds: |w| {
            given(
                w.args,
                &[
                    "-f",
                    "-d",
                    "--force",
                    "--force-with-lease",
                    "--force-if-includes",
                    "--mirror",
                    "--delete",
                    "--prune",
                ],
            ) || operands(w.args, &["-o", "--push-option", "--repo", "--receive-pack", "--exec"])
                .iter()
                .skip(1)
                .any(|r| r.starts_with('+') || r.starts_with(':'))
        },
        verdict: Verdict::Beyond,
        why: "forces, deletes or mirrors remote history",
        examples: &[
            "git push -f",
            "git push --force origin main",
            "git push origin +main",
            "git push origin :main",
            "git push --mirror",
        ],
    },
    Rule {
        names: &["git config"],
        when: "setting, unsetting or editing with `--global`, `--system`, `--file`",
        holds: |w| git_config_elsewhere(w.args),
        verdict: Verdict::Beyond,
        why: "changes git configuration outside the tree, which names programs every later git command runs",
        examples: &["git config --global core.pager 'touch x'", "git config -f other.cfg alias.x '!y'"],
    },
    Rule {
        names: &["git config"],
        when: "setting, unsetting or editing (a value, `--unset`, `--add`, `-e`, `set`, `unset`)",
        holds: |w| git_config_writes(w.args),
        verdict: Verdict::Tree,
        why: "changes the repository's configuration, which names programs git runs later (core.fsmonitor, aliases, hooks path, diff and filter drivers, the pager)",
        examples: &[
            "git config core.fsmonitor 'touch MARK'",
            "git config alias.x '!rm a.txt'",
            "git config diff.external ./x",
            "git config --add core.hooksPath h",
            "git config set core.pager x",
            "git config --unset user.name",
        ],
    },
    Rule {
        names: &["git checkout"],
        when: "`-f`, `-B`, `-p`, `-m`, `--`, or any operand without `-b`/`--orphan` (it may name a path)",
        holds: |w| {
            given(
                w.args,
                &["-f", "-B", "-p", "-m", "--force", "--patch", "--merge", "--ours", "--theirs", "--overwrite-ignore"],
            ) || w.args.iter().any(|a| a == "--")
                || (!operands(w.args, &["-b", "-B", "--orphan", "--conflict", "--pathspec-from-file"]).is_empty()
                    && !given(w.args, &["-b", "--orphan"]))
        },
        verdict: Verdict::Tree,
        why: "overwrites working files: an operand may name a path (`git checkout a.txt` discards its changes; `git switch` takes only branches)",
        examples: &[
            "git checkout a.txt",
            "git checkout .",
            "git checkout -- .",
            "git checkout -f main",
            "git checkout main",
        ],
    },
    Rule {
        names: &["git switch"],
        when: "`-f`, `--discard-changes`, `-C`, `--orphan`, `-m`",
        holds: |w| {
            given(w.args, &["-f", "-C", "-m", "--force", "--discard-changes", "--force-create", "--orphan", "--merge"])
        },
        verdict: Verdict::Tree,
        why: "discards working changes or replaces a branch",
        examples: &["git switch -f main", "git switch --discard-changes x", "git switch --orphan new"],
    },
    Rule {
        names: &["git restore"],
        when: "unless `--staged` alone (the index only)",
        holds: |w| !surely(w.args, &["-S", "--staged"], "q") || given(w.args, &["-W", "--worktree"]),
        verdict: Verdict::Tree,
        why: "overwrites working files",
        examples: &["git restore .", "git restore a.txt", "git restore -S -W a"],
    },
    Rule {
        names: &["git reset"],
        when: "`--hard`, `--merge`, `--keep`",
        holds: |w| given(w.args, &["--hard", "--merge", "--keep"]),
        verdict: Verdict::Tree,
        why: "discards work in the working files",
        examples: &["git reset --hard HEAD~3", "git reset --hard"],
    },
    Rule {
        names: &["git clean"],
        when: "unless `-n`, `--dry-run` (the configuration can drop the need for `-f`)",
        holds: |w| !surely(w.args, &["-n", "--dry-run"], "dxXq"),
        verdict: Verdict::Tree,
        why: "deletes untracked files",
        examples: &["git clean -fdx", "git clean --force", "git clean -d"],
    },
    Rule {
        names: &["git stash"],
        when: "anything but `list`, `show`",
        holds: |w| !matches!(first_operand(w.args), Some("list" | "show")),
        verdict: Verdict::Tree,
        why: "takes uncommitted changes out of the working files, puts stashed ones back over them, or drops them",
        examples: &[
            "git stash",
            "git stash -u",
            "git stash push -m x",
            "git stash pop",
            "git stash clear",
            "git stash drop",
        ],
    },
    Rule {
        names: &["git rm"],
        when: "unless `--cached` or `-n`",
        holds: |w| !surely(w.args, &["--cached", "-n", "--dry-run"], "rfq"),
        verdict: Verdict::Tree,
        why: "deletes working files (with -f, with their uncommitted changes)",
        examples: &["git rm -qf tracked.txt", "git rm -r dir", "git rm a.txt"],
    },
    Rule {
        names: &["git mv"],
        when: "`-f`, `--force`",
        holds: |w| given(w.args, &["-f", "--force"]),
        verdict: Verdict::Tree,
        why: "replaces an existing target",
        examples: &["git mv -f b a"],
    },
    Rule {
        names: &["git branch"],
        when: "`-D`, `-f`, `--force`, `-M`, `-C`",
        holds: |w| given(w.args, &["-D", "-M", "-C", "-f", "--force"]),
        verdict: Verdict::Tree,
        why: "deletes or force-moves a branch",
        examples: &["git branch -D x", "git branch -d -f x", "git branch -f main HEAD~3"],
    },
    Rule {
        names: &["git tag"],
        when: "`-d`, `--delete`, `-f`, `--force`",
        holds: |w| given(w.args, &["-d", "-f", "--delete", "--force"]),
        verdict: Verdict::Tree,
        why: "deletes or moves a tag (tags have no reflog)",
        examples: &["git tag -d v1", "git tag -f v1 HEAD~1"],
    },
    Rule {
        names: &[
            "git update-ref",
            "git filter-branch",
            "git filter-repo",
            "git fast-import",
            "git prune",
            "git gc",
            "git am",
        ],
        when: "always",
        holds: |_| true,
        verdict: Verdict::Tree,
        why: "rewrites refs, history or working files, or prunes objects (how old, the configuration says)",
        examples: &[
            "git update-ref -d refs/heads/x",
            "git filter-branch --all",
            "git gc",
            "git prune",
            "git am x.mbox",
        ],
    },
    Rule {
        names: &["git reflog"],
        when: "`expire`, `delete`",
        holds: |w| matches!(first_operand(w.args), Some("expire" | "delete")),
        verdict: Verdict::Tree,
        why: "drops history the reflog keeps",
        examples: &["git reflog expire --all --expire=now"],
    },
    Rule {
        names: &["git worktree"],
        when: "`remove`",
        holds: |w| first_operand(w.args) == Some("remove"),
        verdict: Verdict::Tree,
        why: "deletes a working tree",
        examples: &["git worktree remove ../x"],
    },
    Rule {
        names: &["git submodule"],
        when: "`foreach`",
        holds: |w| first_operand(w.args) == Some("foreach"),
        verdict: Verdict::Unclassifiable,
        why: "runs a shell command in every submodule",
        examples: &["git submodule foreach 'rm -rf x'"],
    },
    Rule {
        names: &["git submodule"],
        when: "`deinit`",
        holds: |w| first_operand(w.args) == Some("deinit"),
        verdict: Verdict::Tree,
        why: "deletes a submodule's working tree",
        examples: &["git submodule deinit -f x"],
    },
    Rule {
        names: &["git apply"],
        when: "unless only `--check`, `--stat`, `--numstat`, `--summary`",
        holds: |w| !surely(w.args, &["--check", "--stat", "--numstat", "--summary"], "") || given(w.args, &["--apply"]),
        verdict: Verdict::Tree,
        why: "applies a patch: changes, creates and deletes the files the patch names, which its words do not show",
        examples: &["git apply x.patch", "git apply --stat --apply x.patch"],
    },
    Rule {
        names: &["git merge-file"],
        when: "unless `-p`, `--stdout`",
        holds: |w| !surely(w.args, &["-p", "--stdout"], "q"),
        verdict: Verdict::Tree,
        why: "writes its merge over the current file",
        examples: &["git merge-file a.txt base other"],
    },
    Rule {
        names: &["git read-tree"],
        when: "`-u`, `--reset`",
        holds: |w| given(w.args, &["-u", "--reset"]),
        verdict: Verdict::Tree,
        why: "overwrites working files from a tree",
        examples: &["git read-tree -u --reset HEAD"],
    },
    Rule {
        names: &["git checkout-index"],
        when: "`-f`, `--force`",
        holds: |w| given(w.args, &["-f", "--force"]),
        verdict: Verdict::Tree,
        why: "overwrites working files from the index",
        examples: &["git checkout-index -f -a"],
    },
    Rule {
        names: &["git sparse-checkout"],
        when: "anything but `list`, `check-rules`",
        holds: |w| !matches!(first_operand(w.args), Some("list" | "check-rules")),
        verdict: Verdict::Tree,
        why: "removes working files outside its patterns (or brings them back)",
        examples: &["git sparse-checkout set x"],
    },
    Rule {
        names: &["git archive", "git format-patch", "git bundle"],
        when: "`-o`, `--output`, `--output-directory`, format-patch without `--stdout`, `bundle create`",
        holds: |w| {
            given(w.args, &["-o", "--output", "--output-directory"])
                || (w.sub == Some("format-patch") && !surely(w.args, &["--stdout"], ""))
                || (w.sub == Some("bundle") && first_operand(w.args) == Some("create"))
        },
        verdict: Verdict::Tree,
        why: "writes over the files it names",
        examples: &["git archive -o a.txt HEAD", "git format-patch -1", "git bundle create a.txt HEAD"],
    },
    Rule {
        names: &["git *"],
        when: "a subcommand that is none of git's commands",
        holds: |w| w.sub.is_some_and(|s| !git_knows(s)),
        verdict: Verdict::Unclassifiable,
        why: "is no git command: an alias from the repository's configuration (`!…` runs shell code) or a `git-…` program",
        examples: &["git x", "git st"],
    },
    Rule {
        names: &["git *"],
        when: "every other git command but `git version`, `git --version`",
        holds: |w| match w.sub {
            Some(sub) => sub != "version",
            None => given(w.args, &["-h", "--help"]),
        },
        verdict: Verdict::Unclassifiable,
        why: "reads the repository's configuration (`.git/config`, which a tool can write) and runs the programs it names: core.fsmonitor (status, diff, add, …), hooks (commit, checkout, merge, push, …), diff and filter drivers, the pager, core.sshCommand; no `-c` turns them all off",
        examples: &["git status", "git diff", "git log --oneline", "git -c user.name=x commit -m m", "git --help"],
    },
];

/// Whether a row's name list names `program` (`mkfs*`: a prefix).
fn names(rule: &Rule, program: &str) -> bool {
    rule.names.iter().any(|n| match n.strip_suffix('*') {
        Some(prefix) if !prefix.ends_with(' ') && !prefix.is_empty() => program.starts_with(prefix),
        _ => *n == program,
    })
}

/// The rows that hold for `program` with `args` (the `*` rows included),
/// with the name to show.
pub fn holding(program: &str, args: &[String]) -> Vec<&'static Rule> {
    let words = Words { sub: None, args };
    RULES.iter().filter(|r| (names(r, program) || r.names == ["*"]) && (r.holds)(words)).collect()
}

/// Whether any row names `program` (fed unknown arguments, by `xargs` or
/// `find -exec`, any of them may hold).
pub fn known(program: &str) -> Option<&'static Rule> {
    RULES
        .iter()
        .filter(|r| names(r, program) && r.verdict != Verdict::Unclassifiable)
        .max_by_key(|r| r.verdict == Verdict::Beyond)
}

/// The rows that hold for git with `global` options, subcommand `sub` and
/// its `args`: the global-option rows, the subcommand's rows and the `*`
/// rows, else the `git *` rows.
pub fn git_holding(global: &[String], sub: Option<&str>, args: &[String]) -> Vec<(&'static Rule, String)> {
    let shown = |rule: &Rule| match sub {
        Some(sub) if rule.names != ["git"] => format!("git {sub}"),
        _ => "git".to_owned(),
    };
    let mut out: Vec<(&'static Rule, String)> = Vec::new();
    for rule in RULES {
        let holds = if rule.names == ["git"] {
            (rule.holds)(Words { sub, args: global })
        } else if rule.names == ["*"] {
            (rule.holds)(Words { sub, args })
        } else {
            sub.is_some_and(|s| rule.names.iter().any(|n| n.strip_prefix("git ") == Some(s)))
                && (rule.holds)(Words { sub, args })
        };
        if holds {
            out.push((rule, shown(rule)));
        }
    }
    if out.is_empty() {
        let words = Words { sub, args: if sub.is_some() { args } else { global } };
        for rule in RULES.iter().filter(|r| r.names == ["git *"]) {
            if (rule.holds)(words) {
                out.push((rule, shown(rule)));
                break;
            }
        }
    }
    out
}

/// The table as docs/tools.md quotes it.
pub fn markdown() -> String {
    let mut out = String::from("| Command | When | Class | Why |\n|---|---|---|---|\n");
    for rule in RULES {
        let names = rule.names.iter().map(|n| format!("`{n}`")).collect::<Vec<_>>().join(", ");
        out.push_str(&format!("| {names} | {} | {} | {} |\n", rule.when, rule.verdict.label(), rule.why));
    }
    out
}
