//! Classification of a shell command line before it runs, on its parsed
//! form: the words bash would pass after quote removal and escapes (the
//! tokenizer of `cairn_core::approval::cmdline`, the same one allow
//! patterns read),
//! looked at through wrappers (`command`, `env`, `nice`, `nohup`,
//! `timeout`, `sudo`, `xargs`, `find -exec`, `busybox`, git's global
//! options, …).
//!
//! A line is [`Class::Plain`], [`Class::Destructive`] (it overwrites,
//! extracts, patches, deletes recursively, rewrites history or disks, …:
//! the rows of the shapes table, `shapes.rs`, say which programs spelled
//! how, and why; `reach` says
//! whether the damage is to files under the working tree, which a staged
//! run can observe, or beyond it), or [`Class::Unclassifiable`]: its
//! effect cannot be read from its words (an expansion or dynamic command
//! word, `eval`, an interpreter or shell given code, a redirection, a
//! wrapper option that hides a command, a line the tokenizer refuses, a
//! line that runs a file — a script given to a shell or an interpreter, a
//! program named by a path outside the system directories (`./x`), build
//! and task runners and package scripts (`make`, `npm run`, `cargo
//! build`/`test`), and every git command but `git version`, whose effect
//! is in files the line does not show: git runs what the repository's
//! configuration names).
//! What each class needs is decided by the tool that runs the line (the
//! built-in `shell`): unstaged, everything but Plain needs a person; staged,
//! the observed effect decides for all but [`Reach::Beyond`].
//!
//! It must not try to be complete about programs it does not know: an
//! unknown program is Plain (a Write), which is why staging exists. It is
//! pure and never runs anything.

use cairn_core::approval::cmdline;
use cairn_core::approval::indirection::{base, git_runs_command, runs_other_commands};

use super::shapes::{self, Rule, Verdict};

/// Where a destructive command's damage lands.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Reach {
    /// Files under the working tree (`.git` included): a staged run shows it.
    Tree,
    /// Outside the tree: remotes, disks, the machine, other processes.
    Beyond,
}

/// What a command line is, judged by its parsed words.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Class {
    /// Nothing known to destroy (the tool's own risk applies).
    Plain,
    /// A known destructive shape.
    Destructive {
        /// What it does, for the person asked and the log.
        why: String,
        /// Where the damage lands.
        reach: Reach,
    },
    /// Its effect cannot be read from its words.
    Unclassifiable {
        /// Why not.
        why: String,
    },
}

impl Class {
    fn rank(&self) -> u8 {
        match self {
            Class::Plain => 0,
            Class::Destructive { reach: Reach::Tree, .. } => 1,
            Class::Unclassifiable { .. } => 2,
            Class::Destructive { reach: Reach::Beyond, .. } => 3,
        }
    }

    /// Whether this is anything but Plain.
    pub fn is_plain(&self) -> bool {
        matches!(self, Class::Plain)
    }

    /// The reason to show (empty for Plain).
    pub fn why(&self) -> &str {
        match self {
            Class::Plain => "",
            Class::Destructive { why, .. } | Class::Unclassifiable { why } => why,
        }
    }
}

fn tree(why: impl Into<String>) -> Class {
    Class::Destructive { why: why.into(), reach: Reach::Tree }
}
fn beyond(why: impl Into<String>) -> Class {
    Class::Destructive { why: why.into(), reach: Reach::Beyond }
}
fn unknown(why: impl Into<String>) -> Class {
    Class::Unclassifiable { why: why.into() }
}

/// Classify a whole command line: the worst of its simple commands
/// (Beyond-destructive, then unclassifiable, then tree-destructive).
pub fn classify(line: &str) -> Class {
    let commands = match cmdline::words(line) {
        Ok(commands) => commands,
        Err(e) => return unknown(format!("cannot be classified from its words: {e}")),
    };
    let mut worst = Class::Plain;
    for command in &commands {
        let class = classify_simple(command, 0);
        let class = match names_authority(command) {
            Some(named) if named.rank() > class.rank() => named,
            _ => class,
        };
        if class.rank() > worst.rank() {
            worst = class;
        }
    }
    worst
}

/// A command naming an authority path (git's configuration and hooks, other
/// agents' configurations, `.cairn/`: `cairn_core::authority`, the rules
/// that hold in every tree) in any word, an option's value included: what
/// it does there would run later with the user's authority, and without
/// staging nothing shows what changed (issue 46.1: `cp -n x
/// .git/hooks/post-checkout` is no less a planted hook than a redirect).
fn names_authority(command: &[String]) -> Option<Class> {
    let rules = cairn_core::authority::AuthorityRules::default();
    command.iter().skip(1).find_map(|word| {
        let path = word.rsplit_once('=').map_or(word.as_str(), |(_, value)| value);
        rules.classify(std::path::Path::new(""), path).map(|a| tree(format!("it names {}", a.reason())))
    })
}

/// Programs that interpret code given on their command line or stdin.
const INTERPRETERS: &[&str] = &[
    "python",
    "python2",
    "python3",
    "perl",
    "ruby",
    "node",
    "nodejs",
    "deno",
    "bun",
    "php",
    "lua",
    "luajit",
    "tclsh",
    "Rscript",
    "julia",
    "osascript",
    "pwsh",
    "powershell",
];
/// Shells: `-c`, stdin or `-s` run code the words do not show.
const SHELLS: &[&str] = &["sh", "bash", "zsh", "dash", "ksh", "mksh", "fish", "csh", "tcsh", "ash", "yash", "rbash"];
/// Programs whose argument is a program in a language of their own that can
/// run commands (`awk`'s `system`, …) or that run whatever they are given.
const ALWAYS_UNKNOWN: &[&str] = &[
    "eval",
    "source",
    ".",
    "trap",
    "awk",
    "gawk",
    "mawk",
    "nawk",
    "busybox-shell",
    "ssh",
    "parallel",
    "watch",
    "strace",
    "ltrace",
    "chroot",
    "unshare",
    "nsenter",
    "flock",
    "script",
    "run-parts",
    "su",
    "runuser",
    "pkexec",
    "expect",
    "gdb",
    "make-shell",
    "at",
    "batch",
    "crontab",
    "systemd-run",
    "tmux",
    "screen",
    "alias",
    "function",
    "coproc",
];
/// Programs that delete what they are given: fed unknown arguments
/// (`xargs`, `find -exec`) they are Destructive even where the table has no
/// row for them (one named file is a Write).
const DELETERS: &[&str] = &["rm", "rmdir", "unlink"];

/// Variables that, set before a command, change which program runs or what
/// it runs.
fn dangerous_assignment(name: &str) -> bool {
    name.starts_with("LD_")
        || name.starts_with("GIT_")
        || name.starts_with("BASH_FUNC")
        || matches!(
            name,
            "PATH"
                | "BASH_ENV"
                | "ENV"
                | "IFS"
                | "SHELLOPTS"
                | "BASHOPTS"
                | "PS4"
                | "PROMPT_COMMAND"
                | "PAGER"
                | "EDITOR"
                | "VISUAL"
                | "PYTHONSTARTUP"
                | "PYTHONPATH"
                | "PERL5OPT"
                | "PERL5LIB"
                | "RUBYOPT"
                | "NODE_OPTIONS"
                | "MANPAGER"
                | "LESSOPEN"
        )
}

/// `NAME=value` as bash reads an assignment word.
fn assignment(word: &str) -> Option<&str> {
    let (name, _) = word.split_once('=')?;
    let mut chars = name.chars();
    let first = chars.next()?;
    ((first.is_ascii_alphabetic() || first == '_') && chars.all(|c| c.is_ascii_alphanumeric() || c == '_'))
        .then_some(name)
}

/// Depth limit for wrappers inside wrappers.
const MAX_DEPTH: usize = 16;

/// Classify one simple command (argv after quote removal).
fn classify_simple(argv: &[String], depth: usize) -> Class {
    if depth > MAX_DEPTH {
        return unknown("wrappers nested too deep");
    }
    // Assignment prefixes: harmless ones are skipped, those that change
    // what runs are not classifiable.
    let mut i = 0;
    while let Some(word) = argv.get(i) {
        match assignment(word) {
            Some(name) if dangerous_assignment(name) => {
                return unknown(format!("`{name}=` before a command changes what it runs"));
            }
            Some(_) => i += 1,
            None => break,
        }
    }
    let Some(first) = argv.get(i) else {
        return Class::Plain;
    };
    let rest = &argv[i + 1..];
    let program = base(first);
    if first.is_empty() {
        return unknown("an empty command word");
    }
    if ["if", "then", "else", "elif", "fi", "for", "while", "until", "do", "done", "case", "esac", "select", "{", "}"]
        .contains(&program)
        || program == "!"
        || program == "[["
    {
        return unknown(format!("shell keyword `{program}` (compound command)"));
    }
    if ALWAYS_UNKNOWN.contains(&program) {
        return unknown(format!("`{program}` runs code its words do not show"));
    }
    // A script's effect is in the script, not in the line: a file the
    // model may have just written (`write_file cleanup.sh`, then `bash
    // cleanup.sh`).
    if SHELLS.contains(&program) {
        return match rest.first() {
            Some(script) if !script.starts_with('-') && !script.is_empty() => {
                unknown(format!("`{program}` runs the script {script}, whose effect its words do not show"))
            }
            _ => unknown(format!("`{program}` given code inline or on stdin")),
        };
    }
    if INTERPRETERS.iter().any(|p| program == *p || program.starts_with(&format!("{p}.")))
        || is_versioned_python(program)
    {
        return match rest.first() {
            Some(script) if !script.starts_with('-') && !script.is_empty() => {
                unknown(format!("`{program}` runs the program {script}, whose effect its words do not show"))
            }
            _ => unknown(format!("`{program}` given code inline or on stdin (-c/-e)")),
        };
    }
    if let Some(why) = runs_tree_code(first, rest) {
        return unknown(why);
    }
    let inner =
        |from: &[String]| -> Class { if from.is_empty() { Class::Plain } else { classify_simple(from, depth + 1) } };
    match program {
        "command" | "builtin" => {
            let skip = rest.iter().take_while(|w| matches!(w.as_str(), "-p" | "--")).count();
            if rest.iter().any(|w| w == "-v" || w == "-V") {
                return Class::Plain;
            }
            inner(&rest[skip..])
        }
        "exec" => {
            let mut j = 0;
            while let Some(w) = rest.get(j) {
                match w.as_str() {
                    "-c" | "-l" | "-cl" | "-lc" => j += 1,
                    "-a" => j += 2,
                    "--" => {
                        j += 1;
                        break;
                    }
                    _ => break,
                }
            }
            inner(rest.get(j..).unwrap_or_default())
        }
        "nohup" | "time" | "setsid" | "nice" | "ionice" | "stdbuf" | "chrt" | "taskset" | "timeout" | "sudo"
        | "doas" | "env" | "busybox" | "toybox" | "coreutils" | "xargs" | "caffeinate" => wrapper(program, rest, depth),
        "find" => find(rest, depth),
        "git" => git(rest),
        _ => {
            let mut worst = Class::Plain;
            for rule in shapes::holding(program, rest) {
                worst = worse(worst, of_rule(rule, program));
            }
            if let Some(option) = runs_other_commands(&argv[i..]) {
                worst = worse(worst, unknown(format!("`{program}` with `{option}` can run another command")));
            }
            worst
        }
    }
}

/// The class a table row gives, its reason after the command's name.
fn of_rule(rule: &Rule, shown: &str) -> Class {
    let why = format!("`{shown}` {}", rule.why);
    match rule.verdict {
        Verdict::Tree => tree(why),
        Verdict::Beyond => beyond(why),
        Verdict::Unclassifiable => unknown(why),
    }
}

/// The worse of two classes (the first on a tie).
fn worse(a: Class, b: Class) -> Class {
    if b.rank() > a.rank() { b } else { a }
}

/// Why a command runs code from files (of the working tree, typically)
/// rather than code its words show: a program named by a relative path
/// (`./x`, `bin/x`) or an absolute one outside the system directories,
/// build and task runners (`make`, `ninja`, `cmake`, …), package scripts
/// (`npm run`, `npm install`'s lifecycle scripts, `npx`), and compilers
/// that run the tree's build scripts or tests (`cargo build`/`test`/`run`,
/// `go run`/`test`/`generate`).
fn runs_tree_code(first: &str, rest: &[String]) -> Option<String> {
    const SYSTEM: &[&str] = &["/usr/", "/bin/", "/sbin/", "/lib/", "/lib64/", "/nix/store/"];
    if first.contains('/') && !SYSTEM.iter().any(|d| first.starts_with(d)) {
        return Some(format!("`{first}` runs a file whose effect its words do not show"));
    }
    let program = base(first);
    let sub = rest.iter().map(String::as_str).find(|w| !w.starts_with('-'));
    let only_info =
        !rest.is_empty() && rest.iter().all(|w| matches!(w.as_str(), "--version" | "-v" | "-V" | "--help" | "-h"));
    let runs = match program {
        "make" | "gmake" | "bmake" | "ninja" | "just" | "rake" | "cmake" | "scons" | "meson" | "gradle" | "mvn"
        | "ant" | "bazel" | "bazelisk" | "tox" | "nox" | "invoke" | "npx" | "pnpx" | "bunx" => !only_info,
        "npm" | "pnpm" | "yarn" | "bun" => {
            !only_info
                && !matches!(
                    sub,
                    Some("view" | "info" | "ls" | "list" | "outdated" | "help" | "search" | "why" | "config")
                )
        }
        "cargo" => matches!(
            sub,
            Some(
                "build"
                    | "b"
                    | "check"
                    | "c"
                    | "run"
                    | "r"
                    | "test"
                    | "t"
                    | "bench"
                    | "install"
                    | "doc"
                    | "d"
                    | "clippy"
                    | "fix"
                    | "rustc"
                    | "miri"
                    | "nextest"
                    | "llvm-cov"
                    | "tarpaulin"
            )
        ),
        "go" => matches!(sub, Some("run" | "test" | "generate" | "tool")),
        "pytest" | "py.test" | "jest" | "vitest" | "mocha" | "phpunit" | "rspec" | "deno" => true,
        _ => false,
    };
    runs.then(|| {
        let shown = std::iter::once(program).chain(sub).collect::<Vec<_>>().join(" ");
        format!("`{shown}` runs the working tree's own code (build files, scripts, tests), whose effect its words do not show")
    })
}

fn is_versioned_python(program: &str) -> bool {
    ["python", "pypy", "perl", "ruby", "node", "php", "lua"].iter().any(|p| {
        program.strip_prefix(p).is_some_and(|v| !v.is_empty() && v.chars().all(|c| c.is_ascii_digit() || c == '.'))
    })
}

/// Wrappers that run the command in their trailing words: skip their own
/// options (an option we do not know makes the line unclassifiable), then
/// classify what they run.
fn wrapper(program: &str, rest: &[String], depth: usize) -> Class {
    // Options that take a separate value, per wrapper.
    let with_value: &[&str] = match program {
        "nice" => &["-n", "--adjustment"],
        "ionice" => &["-c", "-n", "-p", "-P", "-u", "--class", "--classdata"],
        "stdbuf" => &["-i", "-o", "-e", "--input", "--output", "--error"],
        "timeout" => &["-s", "-k", "--signal", "--kill-after"],
        "sudo" => &["-u", "-g", "-h", "-p", "-C", "-D", "-R", "-T", "-U", "--user", "--group", "--host", "--prompt"],
        "doas" => &["-u", "-C"],
        "env" => &["-u", "--unset"],
        "xargs" => &["-a", "-d", "-E", "-I", "-L", "-n", "-P", "-s", "--arg-file", "--delimiter", "--max-args"],
        "taskset" | "chrt" => &[],
        _ => &[],
    };
    // Options that replace the command with something the words hide.
    let hiding: &[&str] = match program {
        "sudo" => &["-s", "-i", "--shell", "--login", "-e", "--edit"],
        "env" => &["-S", "--split-string", "-C", "--chdir"],
        "doas" => &["-s"],
        // uutils' multi-call binary names the program in an option.
        "coreutils" => &["--coreutils-prog", "--coreutils-prog-shebang"],
        _ => &[],
    };
    let mut j = 0;
    while let Some(w) = rest.get(j) {
        let word = w.as_str();
        if word == "--" {
            j += 1;
            break;
        }
        if program == "env" && assignment(word).is_some() {
            let name = assignment(word).unwrap_or_default();
            if dangerous_assignment(name) {
                return unknown(format!("`env {name}=…` changes what the command runs"));
            }
            j += 1;
            continue;
        }
        if !word.starts_with('-') || word == "-" {
            break;
        }
        let (name, inline_value) = match word.split_once('=') {
            Some((n, _)) if n.starts_with("--") => (n, true),
            _ => (word, false),
        };
        // getopt takes an abbreviation of a long option (`--sp` for
        // `--split-string`).
        let abbreviates = |long: &str| long.starts_with("--") && name.starts_with("--") && long.starts_with(name);
        if hiding.iter().any(|h| {
            name == *h || abbreviates(h) || (!name.starts_with("--") && name.len() > 2 && name[1..].contains(&h[1..]))
        }) {
            return unknown(format!("`{program} {word}` runs a command its words do not show"));
        }
        if program == "nice" && word[1..].chars().all(|c| c.is_ascii_digit()) {
            j += 1;
            continue;
        }
        if (with_value.contains(&name) || (name.len() > 2 && with_value.iter().any(|v| abbreviates(v))))
            && !inline_value
        {
            j += 2;
        } else if !name.starts_with("--") && name.len() > 2 && with_value.contains(&&name[..2]) {
            // `-n10`, `-uroot`: the value is attached.
            j += 1;
        } else {
            j += 1;
        }
    }
    let mut cmd = rest.get(j..).unwrap_or_default();
    if program == "timeout" {
        // The duration comes first.
        cmd = cmd.get(1..).unwrap_or_default();
    }
    if program == "taskset" && !cmd.is_empty() {
        cmd = &cmd[1..];
    }
    if program == "chrt" && !cmd.is_empty() {
        cmd = &cmd[1..];
    }
    if cmd.is_empty() {
        return Class::Plain;
    }
    if program == "xargs" {
        return fed_unknown_arguments("xargs", cmd, depth);
    }
    classify_simple(cmd, depth + 1)
}

/// A command that gets arguments the line does not show (`xargs`, `find
/// -exec … {}`): a deleting program with unknown arguments is Destructive.
fn fed_unknown_arguments(via: &str, cmd: &[String], depth: usize) -> Class {
    let program = cmd.iter().find(|w| assignment(w).is_none()).map_or("", |w| base(w));
    if DELETERS.contains(&program) {
        return tree(format!("`{via}` feeds files to `{program}`"));
    }
    // Arguments the line does not show may be the options that make any
    // of the program's rows hold (a file named `-f`, `-i`, `--output=…`).
    if let Some(rule) = shapes::known(program) {
        let class = of_rule(rule, program);
        let why = format!("`{via}` feeds arguments the line does not show to `{program}` ({})", class.why());
        return match rule.verdict {
            Verdict::Beyond => beyond(why),
            _ => tree(why),
        };
    }
    if program == "git" {
        return unknown(format!("`{via}` feeds unknown arguments to `git`"));
    }
    classify_simple(cmd, depth + 1)
}

/// `find`: `-delete`, the `-fprint` family (they truncate their file) and
/// each `-exec`/`-ok` command.
fn find(args: &[String], depth: usize) -> Class {
    let mut worst = Class::Plain;
    let mut j = 0;
    while let Some(w) = args.get(j) {
        let class = match w.as_str() {
            "-delete" => tree("`find -delete` deletes what it finds"),
            "-fprint" | "-fprint0" | "-fprintf" | "-fls" => tree(format!("`find {w}` truncates its output file")),
            "-exec" | "-execdir" | "-ok" | "-okdir" => {
                let start = j + 1;
                let mut end = start;
                while let Some(x) = args.get(end) {
                    if x == ";" || x == "+" {
                        break;
                    }
                    end += 1;
                }
                let cmd = &args[start.min(args.len())..end.min(args.len())];
                j = end;
                if cmd.is_empty() {
                    unknown("`find -exec` without a command")
                } else {
                    fed_unknown_arguments("find -exec", cmd, depth)
                }
            }
            _ => Class::Plain,
        };
        if class.rank() > worst.rank() {
            worst = class;
        }
        j += 1;
    }
    worst
}

/// `git` with its global options, then its subcommand: the table's git
/// rows (`shapes::git_holding`), and the subcommand options through which
/// git runs a command (`--upload-pack`, `rebase -x`, …).
fn git(args: &[String]) -> Class {
    let mut j = 0;
    while let Some(w) = args.get(j) {
        match w.as_str() {
            "-C" | "-c" | "--git-dir" | "--work-tree" | "--namespace" | "--super-prefix" | "--list-cmds"
            | "--config-env" => j += 2,
            word if word.starts_with('-') => j += 1,
            _ => break,
        }
    }
    let global = args.get(..j).unwrap_or(args);
    let sub = args.get(j).map(String::as_str);
    let rest = args.get(j + 1..).unwrap_or_default();
    let mut worst = Class::Plain;
    if let Some(sub) = sub
        && let Some(option) = git_runs_command(Some(sub), rest)
    {
        worst = unknown(format!("`git {sub} {option}` can run another command"));
    }
    for (rule, shown) in shapes::git_holding(global, sub, rest) {
        worst = worse(worst, of_rule(rule, &shown));
    }
    worst
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    fn class(line: &str) -> Class {
        classify(line)
    }

    /// A word naming an authority path makes the line Destructive however
    /// harmless its program looks (the shapes table's no-overwrite forms
    /// included); a line naming none stays as the table says.
    #[test]
    fn naming_an_authority_path_is_destructive() {
        for line in [
            "cp -n x .git/hooks/post-checkout",
            "mv -n x sub/.git/hooks/pre-commit",
            "tee -a .git/config",
            "cp -n tasks.json .vscode/tasks.json",
            "ln -s /tmp/x .mcp.json",
            "touch .envrc",
            "cp -n x .claude/settings.json",
        ] {
            assert!(matches!(class(line), Class::Destructive { .. }), "{line:?}: {:?}", class(line));
            assert!(class(line).why().contains("it names"), "{line:?}: {:?}", class(line));
        }
        for line in ["cat notes.txt", "cp -n a b", "touch src/main.rs"] {
            assert!(!class(line).why().contains("it names"), "{line:?}: {:?}", class(line));
        }
    }

    /// Every spelling named in issue 16 and more: each is Destructive on
    /// the tree, Destructive beyond it, or unclassifiable — never Plain.
    #[test]
    fn bypass_spellings_are_never_plain() {
        let cases = [
            "'rm' -rf victim",
            "\"rm\" -rf x",
            "r\\m -rf x",
            "r''m -rf x",
            "{rm,-rf,x}",
            "rm${IFS}-rf${IFS}x",
            "x=-rf; rm $x",
            "$(echo rm) -rf x",
            "R=rm; $R -rf x",
            "find x -exec /bin/rm {} +",
            "find x '-delete'",
            "chmod '-R' 000 x",
            "python3 -c \"import shutil; shutil.rmtree('x')\"",
            "git -C . push -f",
            "git -c x.y=1 push --force",
            "'git' push -f",
            "git -C . clean -fdx",
            "git -c alias.x='!touch pwned' x",
            "command rm -rf x",
            "command -p rm -r x",
            "env rm -rf x",
            "env -i FOO=1 rm -rf x",
            "env -S 'rm -rf x'",
            "nice rm -rf x",
            "nice -n 10 rm -rf x",
            "nice -5 rm -rf x",
            "nohup rm -rf x",
            "timeout 5 rm -rf x",
            "timeout -s KILL 5 rm -rf x",
            "timeout --signal=KILL 5 rm -rf x",
            "sudo rm -rf x",
            "sudo -u root rm -rf x",
            "sudo -s",
            "xargs rm < list",
            "ls | xargs rm",
            "ls | xargs -0 rm -f",
            "ls | xargs -I{} rm {}",
            "find . -name '*.o' -exec rm -f {} \\;",
            "find . -execdir shred -u {} +",
            "find . -ok rm {} \\;",
            "find . -fprint out.txt",
            "busybox rm -rf x",
            "/usr/bin/busybox rm -rf x",
            "exec rm -rf x",
            "builtin command rm -rf x",
            "stdbuf -o0 rm -rf x",
            "setsid rm -rf x",
            "ionice -c 3 rm -rf x",
            "time rm -rf x",
            "nice nohup timeout 9 env sudo rm -rf x",
            "rm -r -f x",
            "rm --recursive x",
            "rm -R x",
            "/bin/rm -fr x",
            "\\rm -rf x",
            "rm -rf -- x",
            "shred -u f",
            "truncate -s 0 f",
            ": > f",
            "echo > f",
            "cat /dev/null > f",
            "dd if=/dev/zero of=f bs=1 count=1",
            "dd if=/dev/zero of=/dev/sda",
            "mkfs.ext4 /dev/sdb1",
            "wipefs -a /dev/sdb",
            "chmod -R 000 x",
            "chown -R nobody x",
            "chgrp --recursive nobody x",
            "git push --force origin main",
            "git push origin +main",
            "git push origin :main",
            "git push --mirror",
            "git push --force-with-lease",
            "git push -d origin main",
            "git reset --hard HEAD~3",
            "git clean -f -d",
            "git clean --force",
            "git checkout -- .",
            "git checkout .",
            "git checkout -f main",
            "git restore .",
            "git branch -D x",
            "git stash clear",
            "git filter-branch --all",
            "git -C sub -c user.name=x reset --hard",
            "git --git-dir=.git --work-tree=. clean -fdx",
            "git -c core.sshCommand='touch pwned' fetch",
            "git -c core.pager='touch pwned' log",
            "git fetch --upload-pack='touch pwned' origin",
            "git clone -u 'touch pwned' a b",
            "git rebase -x 'touch pwned' main",
            "git difftool --extcmd='touch pwned'",
            "git --exec-path=/tmp/x status",
            "python -c 'print(1)'",
            "python3.12 -c 'x'",
            "perl -e 'unlink \"x\"'",
            "ruby -e 'x'",
            "node -e 'x'",
            "sh -c 'rm -rf x'",
            "bash -c 'rm -rf x'",
            "/bin/bash -lc x",
            "curl x | sh",
            "eval 'rm -rf x'",
            ". ./script",
            "source ./script",
            "awk 'BEGIN{system(\"rm -rf x\")}'",
            "PATH=/tmp/evil ls",
            "LD_PRELOAD=/tmp/x.so ls",
            "env PATH=. ls",
            "mv x /dev/null",
            "kill -9 -1",
            "shutdown -h now",
            "systemctl poweroff",
            "(rm -rf x)",
            "{ rm -rf x; }",
            "if true; then rm -rf x; fi",
            "for f in *; do rm $f; done",
            "rm -rf x &",
            "ls; rm -rf x",
            "ls && rm -rf x",
            "false || rm -rf x",
            "cat x | rm -rf y",
            ":(){ :|:& };:",
            "`echo rm` -rf x",
            "rm -rf ~",
            "rm -rf {a,b}",
            "sed -n '1e touch pwned' f",
            "sed 's/a/b/e' f",
            "tar -xf a.tar --to-command='sh -c x'",
            "rsync -e 'sh -c x' a b",
            "ssh host rm -rf x",
            "watch rm -rf x",
        ];
        assert!(cases.len() >= 60);
        for line in cases {
            assert!(!classify(line).is_plain(), "{line:?} was Plain");
        }
    }

    #[test]
    fn the_reach_is_what_staging_can_observe() {
        for line in ["git push -f", "git -C . push --force", "mkfs /dev/sdb", "dd of=/dev/sda if=x", "reboot"] {
            assert!(matches!(class(line), Class::Destructive { reach: Reach::Beyond, .. }), "{line:?}");
        }
        for line in ["rm -rf x", "git clean -fdx", "find . -delete", "truncate -s0 f", "chmod -R 0 x"] {
            assert!(matches!(class(line), Class::Destructive { reach: Reach::Tree, .. }), "{line:?}");
        }
        for line in ["$(echo rm) -rf x", "sh -c ls", "python3 -c 1", "git -c alias.x=!y x", "ls > f"] {
            assert!(matches!(class(line), Class::Unclassifiable { .. }), "{line:?}");
        }
    }

    /// Issue 25: a line that runs a file (a script the model may have just
    /// written, the tree's build files or tests) cannot be judged by its
    /// words: unstaged, it needs a person.
    #[test]
    fn running_files_of_the_tree_is_unclassifiable() {
        for line in [
            "bash cleanup.sh",
            "sh x.sh",
            "sh -c 'true'",
            "bash ./build.sh",
            "python x.py",
            "python3 script.py",
            "python3 -",
            "node x.js",
            "perl x.pl",
            "ruby x.rb",
            "make",
            "make -j4 all",
            "npm run build",
            "npm install",
            "npx something",
            "yarn",
            "./x",
            "bin/x --flag",
            "exec ./x",
            "nice -n 5 ./configure",
            "source x",
            ". x",
            "cargo build",
            "cargo test -- --nocapture",
            "timeout 10 cargo test",
            "go test ./...",
            "/home/u/work/x",
        ] {
            assert!(matches!(class(line), Class::Unclassifiable { .. }), "{line:?}: {:?}", class(line));
        }
    }

    #[test]
    fn ordinary_commands_stay_plain() {
        for line in [
            "ls -la",
            "cargo fmt --check",
            "cargo --version",
            "git --version",
            "git version",
            "grep -rn foo .",
            "rm file.txt",
            "rm -f a.o",
            "echo rm -rf x",
            "/usr/bin/env",
            "find . -name '*.rs'",
            "nice -n 5 cargo fmt",
            "timeout 10 ls",
            "env FOO=1 cargo fmt",
            "FOO=1 cargo tree",
            "npm view left-pad",
            "xargs echo",
            "sed 's/a/b/' f",
            "mkdir -p out && touch out/x",
            "command -v rm",
            "chmod +x script.sh",
        ] {
            assert_eq!(class(line), Class::Plain, "{line:?}");
        }
    }

    /// Issue 46.5: 40 destructive lines, each with the class it must have.
    /// The first 16 were Plain before (a `--yes` run without staging let
    /// them through); the other 24 already held.
    pub(crate) const FORTY: &[(&str, Kind)] = &[
        ("tee a.txt", Kind::Tree),
        ("sort -o a.txt b.txt", Kind::Tree),
        ("uniq b.txt a.txt", Kind::Tree),
        ("cp /dev/null a.txt", Kind::Tree),
        ("mv b.txt a.txt", Kind::Tree),
        ("install -m 644 b.txt a.txt", Kind::Tree),
        ("ln -sf b.txt a.txt", Kind::Tree),
        ("tar xf evil.tar", Kind::Tree),
        ("unzip -o evil.zip", Kind::Tree),
        ("patch -i evil.patch", Kind::Tree),
        ("sed -f x.sed a.txt", Kind::Unclassifiable),
        ("git config alias.x '!rm a.txt'", Kind::Tree),
        ("git x", Kind::Unclassifiable),
        ("git config core.fsmonitor 'touch MARK'", Kind::Tree),
        ("git status", Kind::Unclassifiable),
        ("git config diff.external ./x", Kind::Tree),
        ("git diff", Kind::Unclassifiable),
        ("git checkout a.txt", Kind::Tree),
        ("git stash", Kind::Tree),
        // The 24 that already held.
        ("rm -rf victim", Kind::Tree),
        ("rm -r victim/sub", Kind::Tree),
        ("find . -delete", Kind::Tree),
        ("find . -name '*.txt' -exec rm '{}' +", Kind::Tree),
        ("shred -u a.txt", Kind::Tree),
        ("truncate -s 0 a.txt", Kind::Tree),
        (": > a.txt", Kind::Unclassifiable),
        ("echo x > a.txt", Kind::Unclassifiable),
        ("dd if=/dev/zero of=a.txt bs=1 count=1", Kind::Tree),
        ("dd if=/dev/zero of=/dev/sda", Kind::Beyond),
        ("mkfs.ext4 /dev/sdb1", Kind::Beyond),
        ("chmod -R 000 victim", Kind::Tree),
        ("git reset --hard HEAD~1", Kind::Tree),
        ("git clean -fdx", Kind::Tree),
        ("git checkout -- .", Kind::Tree),
        ("git restore .", Kind::Tree),
        ("git push --force origin main", Kind::Beyond),
        ("git stash clear", Kind::Tree),
        ("git branch -D topic", Kind::Tree),
        ("git filter-branch --all", Kind::Tree),
        ("bash -c 'rm -rf victim'", Kind::Unclassifiable),
        ("python3 -c 'import os; os.remove(\"a.txt\")'", Kind::Unclassifiable),
        ("ls | xargs rm", Kind::Tree),
        ("perl -pi -e 's/a//' a.txt", Kind::Unclassifiable),
    ];

    /// A class without its reason.
    #[derive(Debug, Clone, Copy, PartialEq, Eq)]
    pub(crate) enum Kind {
        Tree,
        Beyond,
        Unclassifiable,
    }

    pub(crate) fn kind(class: &Class) -> Option<Kind> {
        match class {
            Class::Plain => None,
            Class::Destructive { reach: Reach::Tree, .. } => Some(Kind::Tree),
            Class::Destructive { reach: Reach::Beyond, .. } => Some(Kind::Beyond),
            Class::Unclassifiable { .. } => Some(Kind::Unclassifiable),
        }
    }

    #[test]
    fn forty_destructive_lines_have_their_class() {
        // 16 attacks of the issue; the git ones are two lines each.
        assert_eq!(FORTY.len(), 43);
        let wrong: Vec<String> = FORTY
            .iter()
            .filter(|(line, want)| kind(&class(line)) != Some(*want))
            .map(|(line, want)| format!("{line:?}: {:?}, want {want:?}", class(line)))
            .collect();
        assert!(wrong.is_empty(), "{}", wrong.join("\n"));
    }

    /// Spellings a hostile model plans across calls: wrappers, paths,
    /// quotes, escapes, long options and their abbreviations, attached
    /// values, fed arguments.
    #[test]
    fn hostile_spellings_of_overwriting_extracting_patching_and_git() {
        let cases: &[(&str, Kind)] = &[
            ("command tee a.txt", Kind::Tree),
            ("/usr/bin/tee a.txt", Kind::Tree),
            ("\\tee a.txt", Kind::Tree),
            ("'tee' a.txt", Kind::Tree),
            ("\"t\"ee a.txt", Kind::Tree),
            ("busybox tee a.txt", Kind::Tree),
            ("toybox cp b a", Kind::Tree),
            ("coreutils cp b a", Kind::Tree),
            ("coreutils --coreutils-prog=cp b a", Kind::Unclassifiable),
            ("echo x | tee -p a.txt", Kind::Tree),
            ("stdbuf -o0 tee a.txt", Kind::Tree),
            ("exec tee a.txt", Kind::Tree),
            ("sudo tee /etc/hosts", Kind::Tree),
            ("sort --output=a.txt b", Kind::Tree),
            ("sort --outp=a.txt b", Kind::Tree),
            ("sort --output a.txt b", Kind::Tree),
            ("sort -uoa.txt b", Kind::Tree),
            ("nohup sort -o a.txt b", Kind::Tree),
            ("time uniq b a", Kind::Tree),
            ("cp -f b a", Kind::Tree),
            ("cp --force b a", Kind::Tree),
            ("cp -n -f b a", Kind::Tree),
            ("cp -tn dir b", Kind::Tree),
            ("cp --no-clobber --remove-destination b a", Kind::Tree),
            ("mv -n -i b a", Kind::Tree),
            ("doas mv b a", Kind::Tree),
            ("ln -s -f b a", Kind::Tree),
            ("ln --backup b a", Kind::Tree),
            ("install -C b a", Kind::Tree),
            ("dd of=a.txt", Kind::Tree),
            ("rsync b a", Kind::Tree),
            ("rsync -av b a", Kind::Tree),
            ("rsync -Tn b a", Kind::Tree),
            ("rsync -a b host:a", Kind::Beyond),
            ("truncate -s0 a", Kind::Tree),
            ("fallocate --punch-hole -l 1 a", Kind::Tree),
            ("split -b 1 a.txt", Kind::Tree),
            ("xargs cp b < list", Kind::Unclassifiable),
            ("ls | xargs -I'{}' cp '{}' a.txt", Kind::Tree),
            ("ls | xargs cp -n -t out", Kind::Tree),
            ("find . -name b -exec cp '{}' a.txt \\;", Kind::Tree),
            ("find . -exec tee a.txt \\;", Kind::Tree),
            ("ls | xargs sed -n p", Kind::Tree),
            ("ls | xargs tar", Kind::Tree),
            ("tar -x -f a.tar", Kind::Tree),
            ("tar --get -f a.tar", Kind::Tree),
            ("tar --extr -f a.tar", Kind::Tree),
            ("tar -C out -xf a.tar", Kind::Tree),
            ("tar -xf a.tar --to-command=x", Kind::Unclassifiable),
            ("gtar xf a", Kind::Tree),
            ("bsdtar -xf a", Kind::Tree),
            ("busybox tar x -f a.tar", Kind::Tree),
            ("/usr/bin/unzip -o a.zip", Kind::Tree),
            ("unzip -qq a.zip", Kind::Tree),
            ("7z x a.7z", Kind::Tree),
            ("gunzip -f a.gz", Kind::Tree),
            ("cpio -idv", Kind::Tree),
            ("patch -p1 -i x.diff", Kind::Tree),
            ("patch < x.diff", Kind::Unclassifiable),
            ("git apply x.patch", Kind::Tree),
            ("git am x.mbox", Kind::Tree),
            ("sed -nf x.sed a", Kind::Unclassifiable),
            ("sed --file=x.sed a", Kind::Unclassifiable),
            ("sed -e 1d -f x.sed a", Kind::Unclassifiable),
            ("sed -i -f x.sed a", Kind::Unclassifiable),
            ("ed -s a.txt", Kind::Unclassifiable),
            ("curl -sSLo a.txt http://x/", Kind::Tree),
            ("wget -O a.txt http://x/", Kind::Tree),
            ("git log --output=a.txt", Kind::Tree),
            ("env git status", Kind::Unclassifiable),
            ("env -i git config core.fsmonitor x", Kind::Tree),
            ("command git stash", Kind::Tree),
            ("nice -n 5 git checkout a.txt", Kind::Tree),
            ("timeout 5 git x", Kind::Unclassifiable),
            ("/usr/bin/git checkout a.txt", Kind::Tree),
            ("'git' stash", Kind::Tree),
            ("g\\it stash", Kind::Tree),
            ("git -C . -c core.fsmonitor='touch M' status", Kind::Unclassifiable),
            ("git -c core.fsmonitor=false status", Kind::Unclassifiable),
            ("git --git-dir=.git --work-tree=. checkout a.txt", Kind::Tree),
            ("git --no-pager diff", Kind::Unclassifiable),
            ("git --exec-path status", Kind::Unclassifiable),
            ("git --exec-path=/tmp status", Kind::Unclassifiable),
            ("git -c alias.x='!rm a' x", Kind::Unclassifiable),
            ("git config --global alias.x '!rm a'", Kind::Beyond),
            ("git config --local core.hooksPath h", Kind::Tree),
            ("git config --replace-all core.pager x", Kind::Tree),
            ("git config -e", Kind::Tree),
            ("git diff --ext-diff", Kind::Unclassifiable),
            ("git -c diff.external=./x diff", Kind::Unclassifiable),
            ("git stash push", Kind::Tree),
            ("git stash pop", Kind::Tree),
            ("git checkout main", Kind::Tree),
            ("git clean -d", Kind::Tree),
            ("GIT_CONFIG_COUNT=1 git status", Kind::Unclassifiable),
            ("env --sp='rm -rf x'", Kind::Unclassifiable),
            ("timeout --sig KILL 5 rm -rf x", Kind::Tree),
            ("sudo --us root rm -rf x", Kind::Tree),
        ];
        let wrong: Vec<String> = cases
            .iter()
            .filter(|(line, want)| kind(&class(line)) != Some(*want))
            .map(|(line, want)| format!("{line:?}: {:?}, want {want:?}", class(line)))
            .collect();
        assert!(wrong.is_empty(), "{} wrong:\n{}", wrong.len(), wrong.join("\n"));
    }

    /// The no-clobber, append, listing and dry-run forms stay Plain: the
    /// table exempts them only when spelled unambiguously.
    #[test]
    fn forms_that_replace_nothing_stay_plain() {
        for line in [
            "cp -n b a",
            "cp --no-clobber b a",
            "cp -rn src dst",
            "cp --update=none b a",
            "mv -n b a",
            "mv -vn b a",
            "tee -a log.txt",
            "echo x | tee",
            "echo x | tee /dev/null",
            "sort a b",
            "sort -u -k2 a",
            "uniq a",
            "ln -s b a",
            "install -d out",
            "tar tf a.tar",
            "tar -tzf a.tgz",
            "tar -czf - src",
            "tar -c src",
            "unzip -l a.zip",
            "unzip -t a.zip",
            "7z l a.7z",
            "patch --dry-run -i x",
            "rsync -n -a b a",
            "rsync -avn b a",
            "gzip -c a",
            "gzip -dc a.gz",
            "zcat a.gz",
            "dd if=a of=/dev/null",
            "sed -n p f",
            "sed -e 's/a/b/' f",
            "curl -sS http://x/",
            "ar t lib.a",
            "cpio -itv",
            "git --version",
        ] {
            assert_eq!(class(line), Class::Plain, "{line:?}");
        }
    }

    /// Every git command but `git version` reads the repository's
    /// configuration and runs what it names: without staging it needs a
    /// person, and the reason says so.
    #[test]
    fn every_git_command_runs_the_repositorys_configuration() {
        for line in [
            "git status",
            "git diff",
            "git log --oneline",
            "git -C sub log --oneline",
            "git -c user.name=x commit -m msg",
            "git -c core.fsmonitor=false -c core.hooksPath=/dev/null status",
            "git push origin main",
            "git checkout -b feature",
            "git switch main",
            "git restore --staged f",
            "git stash list",
            "git config --get user.name",
            "git config user.name",
            "git config --list",
            "git fetch",
            "git --help",
        ] {
            match class(line) {
                Class::Unclassifiable { why } => assert!(why.contains("configuration"), "{line:?}: {why}"),
                other => panic!("{line:?}: {other:?}"),
            }
        }
    }

    #[test]
    fn hostile_lines_never_panic() {
        for line in [
            "",
            " ",
            "--",
            "-",
            "find -exec",
            "xargs",
            "timeout",
            "git -c",
            "sudo --",
            "env -u",
            "\\",
            "tar",
            "tar -",
            "tar f",
            "tar --file",
            "git config",
            "git --config-env",
            "sort -o",
            "ar",
            "cp",
            "rsync :",
            "7z",
            "git stash --",
        ] {
            let _ = classify(line);
        }
    }
}

/// The shapes table held against the classifier that reads it (here, beside
/// its only user, so the table module needs nothing of the classifier).
#[cfg(test)]
mod shape_rows {
    use super::super::shapes::*;
    use super::{Class, Reach, classify};

    fn verdict(class: &Class) -> Option<Verdict> {
        match class {
            Class::Plain => None,
            Class::Destructive { reach: Reach::Tree, .. } => Some(Verdict::Tree),
            Class::Destructive { reach: Reach::Beyond, .. } => Some(Verdict::Beyond),
            Class::Unclassifiable { .. } => Some(Verdict::Unclassifiable),
        }
    }

    /// Every row holds for its examples, with its class and its reason.
    #[test]
    fn every_row_holds_for_its_examples() {
        let mut wrong = Vec::new();
        for rule in RULES {
            assert!(!rule.examples.is_empty(), "{:?} has no example", rule.names);
            for line in rule.examples {
                let class = classify(line);
                if verdict(&class) != Some(rule.verdict) || !class.why().contains(rule.why) {
                    wrong.push(format!("{:?} / {line:?}: {class:?}", rule.names));
                }
            }
        }
        assert!(wrong.is_empty(), "{} rows do not hold:\n{}", wrong.len(), wrong.join("\n"));
    }

    /// docs/tools.md quotes the table exactly. `CAIRN_WRITE_DOCS=1` writes
    /// it there (between the markers) instead of failing.
    #[test]
    fn the_docs_quote_the_table() {
        const BEGIN: &str = "<!-- shell shapes: generated from builtin/shell/shapes.rs -->\n";
        const END: &str = "<!-- end of shell shapes -->";
        let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../docs/tools.md");
        let docs = std::fs::read_to_string(&path).unwrap();
        let start = docs.find(BEGIN).expect("docs/tools.md has the shapes markers") + BEGIN.len();
        let end = docs[start..].find(END).expect("docs/tools.md has the end marker") + start;
        let table = markdown();
        if docs[start..end] != table {
            if std::env::var_os("CAIRN_WRITE_DOCS").is_some() {
                std::fs::write(&path, format!("{}{table}{}", &docs[..start], &docs[end..])).unwrap();
            } else {
                panic!(
                    "docs/tools.md does not quote the shapes table; run with CAIRN_WRITE_DOCS=1 to write it:\n{table}"
                );
            }
        }
    }

    #[test]
    fn the_table_has_no_cell_that_breaks_markdown() {
        for rule in RULES {
            for text in [rule.when, rule.why] {
                assert!(!text.contains('|') && !text.contains('\n'), "{:?}: {text}", rule.names);
            }
        }
    }
}
