//! The allowlist judged by bash itself. For every command line the
//! allowlist accepts for a rule, a real bash runs the line in a harness
//! where nothing real can execute, records the argv of every command it
//! would have run, and the test compares that record with what the
//! allowlist believed (`cmdline::parse`). The oracle shares no code with
//! the parser: it is bash's own reading of the line.
//!
//! The harness (built in a temp dir for each test):
//! - `bash -r -c LINE` (restricted: no command names with `/`, no output
//!   redirections, no `exec`, no changes to PATH or BASH_ENV), environment
//!   cleared, stdin from /dev/null, working directory an empty temp dir;
//! - `BASH_ENV` (read before the restrictions start) makes PATH a readonly
//!   directory holding only the recorder, defines a readonly
//!   `command_not_found_handle` that hands the command to the recorder,
//!   turns globbing off (`set -f`, so a word is compared as written) and
//!   disables every builtin — so `eval`, `exec`, `command`, `echo`, `:` …
//!   are not found either, and every simple command bash executes,
//!   including those inside `$(…)`, backticks, functions and here-docs,
//!   reaches the recorder with its final argv;
//! - the recorder is a `sh` script that appends `argc NUL argv… NUL` to a
//!   file named after its pid, and does nothing else.
//!
//! It needs bash and sh; without them the tests fail saying so.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use cairn_core::approval::Allowlist;
use cairn_core::approval::cmdline;
use cairn_core::tool::Risk;
use proptest::prelude::*;

/// A program found on the test's own PATH (the harness's PATH is empty).
fn find_program(name: &str) -> PathBuf {
    let path = std::env::var_os("PATH").unwrap_or_default();
    std::env::split_paths(&path)
        .map(|dir| dir.join(name))
        .find(|p| p.is_file())
        .unwrap_or_else(|| panic!("this test needs `{name}` on PATH to run the oracle; install it"))
}

struct Harness {
    _dir: tempfile::TempDir,
    bash: PathBuf,
    bin: PathBuf,
    cwd: PathBuf,
    log: PathBuf,
    bash_env: PathBuf,
}

/// The commands one run of a line executed, each as its argv.
#[derive(Debug, Default)]
struct Trace {
    executed: Vec<Vec<String>>,
    stderr: String,
}

impl Harness {
    fn new() -> Self {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().to_path_buf();
        let (bin, cwd, log) = (root.join("bin"), root.join("cwd"), root.join("log"));
        for d in [&bin, &cwd, &log] {
            std::fs::create_dir(d).unwrap();
        }
        let sh = find_program("sh");
        let recorder = bin.join("__cairn_record");
        std::fs::write(
            &recorder,
            format!("#!{}\nprintf '%s\\0' \"$#\" \"$@\" >> '{}/'\"$$\"\n", sh.display(), log.display()),
        )
        .unwrap();
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&recorder, std::fs::Permissions::from_mode(0o755)).unwrap();
        let bash_env = root.join("bash_env");
        std::fs::write(
            &bash_env,
            "command_not_found_handle() { __cairn_record \"$@\"; }\n\
             readonly -f command_not_found_handle\n\
             set -f\n\
             readonly PATH HOME\n\
             for b in $(compgen -b); do case $b in enable) ;; *) enable -n \"$b\" ;; esac; done\n\
             enable -n enable\n",
        )
        .unwrap();
        Self { bash: find_program("bash"), bin, cwd, log, bash_env, _dir: dir }
    }

    /// Run `line` and return what bash executed.
    fn trace(&self, line: &str) -> Trace {
        for entry in std::fs::read_dir(&self.log).unwrap() {
            std::fs::remove_file(entry.unwrap().path()).unwrap();
        }
        let mut child = Command::new(&self.bash)
            .arg("-r")
            .arg("-c")
            .arg(line)
            .env_clear()
            .env("PATH", &self.bin)
            .env("HOME", "/nonexistent-home")
            .env("BASH_ENV", &self.bash_env)
            .current_dir(&self.cwd)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        // A guard against a line that loops forever, not a timing check:
        // the limit is far above what any line here needs.
        let deadline = Instant::now() + Duration::from_secs(60);
        let status = loop {
            if let Some(status) = child.try_wait().unwrap() {
                break status;
            }
            if Instant::now() > deadline {
                let _ = child.kill();
                let _ = child.wait();
                panic!("bash did not finish {line:?} within a minute");
            }
            std::thread::sleep(Duration::from_millis(2));
        };
        let _ = status;
        let mut stderr = String::new();
        if let Some(mut err) = child.stderr.take() {
            use std::io::Read;
            let _ = err.read_to_string(&mut stderr);
        }
        let mut executed = Vec::new();
        for entry in std::fs::read_dir(&self.log).unwrap() {
            let bytes = std::fs::read(entry.unwrap().path()).unwrap();
            executed.extend(decode_records(&bytes));
        }
        executed.sort();
        Trace { executed, stderr }
    }

    /// Nothing the line did escaped the harness: the working directory
    /// is still empty.
    fn cwd_untouched(&self) -> bool {
        std::fs::read_dir(&self.cwd).unwrap().next().is_none()
    }
}

/// `argc NUL argv… NUL`, repeated.
fn decode_records(bytes: &[u8]) -> Vec<Vec<String>> {
    let mut fields = bytes.split(|b| *b == 0).map(|f| String::from_utf8_lossy(f).into_owned());
    let mut records = Vec::new();
    while let Some(count) = fields.next() {
        if count.is_empty() {
            break;
        }
        let count: usize = count.parse().unwrap_or_else(|_| panic!("bad record count {count:?}"));
        records.push((0..count).map(|_| fields.next().expect("record cut short")).collect());
    }
    records
}

fn words(w: &[&str]) -> Vec<String> {
    w.iter().map(|s| (*s).to_owned()).collect()
}

fn accepts(list: &Allowlist, line: &str) -> bool {
    list.check("shell", Risk::Write, &serde_json::json!({ "command": line })).is_ok()
}

/// What must hold for a line the allowlist accepts for `shell(ls *)`:
/// bash executed only `ls`, and every command it executed is one the
/// allowlist believed the line runs, with the same words (a command may
/// run fewer times than believed: `ls || ls`).
fn check_accepted_ls_line(harness: &Harness, list: &Allowlist, line: &str) -> Result<(), String> {
    if !accepts(list, line) {
        return Ok(());
    }
    let believed = cmdline::parse(line).map_err(|e| format!("accepted {line:?} but the parser refuses it: {e}"))?;
    let trace = harness.trace(line);
    let mut remaining: BTreeMap<&Vec<String>, usize> = BTreeMap::new();
    for argv in &believed {
        *remaining.entry(argv).or_default() += 1;
    }
    for argv in &trace.executed {
        if argv.first().map(String::as_str) != Some("ls") {
            return Err(format!(
                "`shell(ls *)` accepted {line:?}, but bash ran {argv:?} (all: {:?}; stderr: {})",
                trace.executed, trace.stderr
            ));
        }
        match remaining.get_mut(argv) {
            Some(n) if *n > 0 => *n -= 1,
            _ => {
                return Err(format!(
                    "the allowlist believed {line:?} runs {believed:?}, but bash ran {argv:?} (all: {:?})",
                    trace.executed
                ));
            }
        }
    }
    if !harness.cwd_untouched() {
        return Err(format!("running {line:?} changed the working directory"));
    }
    Ok(())
}

#[test]
fn the_harness_sees_every_command_and_runs_nothing_real() {
    let harness = Harness::new();
    let t = harness.trace("ls -la 'a b' * ~");
    assert_eq!(t.executed, vec![words(&["ls", "-la", "a b", "*", "/nonexistent-home"])], "{}", t.stderr);
    // Hidden commands, builtins and indirections all reach the recorder.
    for (line, hidden) in [
        ("'rm' -rf victim", "rm"),
        ("eval rm x", "eval"),
        ("ls $(rm x)", "rm"),
        ("ls `rm x`", "rm"),
        ("x=rm; $x y", "rm"),
        ("{rm,-rf,x}", "rm"),
        ("exec rm q", "exec"),
        ("command rm c", "command"),
        ("echo hi", "echo"),
        ("f() { rm z; }; f", "rm"),
        ("ls <(rm p)", "rm"),
        ("cat <<EOF\n$(rm h)\nEOF", "rm"),
        ("ls; : ok", ":"),
    ] {
        let t = harness.trace(line);
        assert!(t.executed.iter().any(|argv| argv[0] == hidden), "{line:?} ran {:?}: {}", t.executed, t.stderr);
    }
    // Nothing real runs and nothing is written, whatever the line tries.
    let victim = harness.cwd.join("victim");
    std::fs::write(&victim, "x").unwrap();
    for line in [
        "/bin/rm victim",
        "PATH=/bin:/usr/bin; rm victim",
        "PATH=/bin:/usr/bin rm victim",
        "BASH_ENV=/dev/null rm victim",
        "echo x > victim",
        "enable rm; hash -p /bin/rm rm; rm victim",
        "set +r; /bin/rm victim",
        "command_not_found_handle() { :; }; /bin/rm victim",
        "unset -f command_not_found_handle; rm victim",
    ] {
        let t = harness.trace(line);
        assert!(victim.exists(), "{line:?} removed the victim: {t:?}");
        assert!(t.executed.iter().all(|argv| argv[0] != "/bin/rm"), "{t:?}");
    }
    std::fs::remove_file(&victim).unwrap();
}

#[test]
fn the_oracle_catches_a_wrong_belief() {
    // The check must be able to fail: fed an allowlist rule that the line
    // really breaks (`ls *` accepting a line that runs rm is impossible,
    // so test the comparison directly with a false belief).
    let harness = Harness::new();
    let t = harness.trace("ls; rm -rf x");
    assert!(t.executed.contains(&words(&["rm", "-rf", "x"])), "{t:?}");
    let t = harness.trace("ls \"\\$\" ~");
    assert_eq!(t.executed, vec![words(&["ls", "$", "/nonexistent-home"])], "a parser believing `\\$` or `~` is caught");
}

/// Spellings that try to run something other than `ls` (or `ls` with words
/// other than those the allowlist read) under `shell(ls *)`.
const HOSTILE: &[&str] = &[
    "'rm' -rf victim",
    "\"rm\" -rf x",
    "r\\m -rf x",
    "r''m -rf x",
    "{rm,-rf,x}",
    "rm${IFS}-rf${IFS}x",
    "x=-rf; rm $x",
    "$(echo rm) -rf x",
    "R=rm; $R -rf x",
    "ls; rm -rf x",
    "ls $(rm -rf x)",
    "ls && rm x",
    "ls | xargs rm",
    "ls -la\nrm -rf x",
    "ls -la\\\nrm -rf x",
    "ls \\\nrm",
    "ls # comment\nrm x",
    "ls '#' ; rm x",
    "ls \"#\"; rm",
    "ls ''#\nrm",
    "ls\trm",
    "ls\r\nrm",
    "ls {a,b}",
    "ls {,rm}",
    "ls l{s,}",
    "l{s,} x",
    "ls ~",
    "ls ~root",
    "ls x=~/y",
    "ls a:~",
    "ls \"\\$\" \"\\`\" \"\\\\\"",
    "ls \"a\\\nb\"",
    "ls 'a\\\nb'",
    "ls \\'rm\\'",
    "ls \"'\"rm\"'\"",
    "ls `rm`",
    "ls \"`rm`\"",
    "ls \"$(rm)\"",
    "ls $'\\x72m'",
    "ls ${IFS}rm",
    "ls *",
    "ls /*",
    "ls [r]m",
    "alias ls=rm; ls x",
    "alias ls='rm -rf'\nls x",
    "command rm x",
    "exec rm x",
    "eval rm x",
    "builtin eval rm",
    "ls; exec rm",
    "ls > x",
    "ls < /etc/passwd",
    "ls <<EOF\n$(rm x)\nEOF",
    "ls <<'EOF'\nrm\nEOF",
    "ls 2>&1",
    "ls &>x",
    "ls & rm",
    "ls || rm",
    "ls ||\nrm",
    "ls &&\n# c\nrm",
    "ls |\nrm",
    "ls;;rm",
    "ls ; ; rm",
    "(rm)",
    "{ rm; }",
    "ls() { rm; }; ls",
    "function ls { rm; }; ls",
    "! rm",
    "if ls; then rm; fi",
    "for x in rm; do $x; done",
    "[[ -n $(rm) ]]",
    "((x=$(rm)))",
    "ls \\;rm",
    "ls \\|rm",
    "ls \\&\\& rm",
    "ls \\\\; rm",
    "\\ls; \\rm",
    "ls -- -rf",
    "ls ../..",
    "ls ./rm",
    "./ls",
    "/bin/ls",
    "PATH=. ls",
    "ls \u{00a0}rm",
    "ls\u{00a0}rm",
    "ls \u{1b}]0;x\u{7}",
];

#[test]
fn hostile_spellings_run_only_what_the_allowlist_believed() {
    let harness = Harness::new();
    let list = Allowlist::parse(["shell(ls *)"]).unwrap();
    let mut accepted = 0;
    for line in HOSTILE {
        if accepts(&list, line) {
            accepted += 1;
        }
        if let Err(problem) = check_accepted_ls_line(&harness, &list, line) {
            panic!("{problem}");
        }
    }
    // The list holds harmless spellings too, so the comparison did run.
    assert!(accepted >= 10, "only {accepted} lines were accepted; the check compared too little");
}

/// Fragments hostile lines are built from.
const FRAGMENTS: &[&str] = &[
    "ls", "ls", "ls", "rm", "x", "-rf", " ", " ", " ", "\t", "\n", "'", "\"", "\\", "\\\n", "''", "\"\"", "'rm'",
    "\"rm\"", "r\\m", "{", "}", ",", "{a,b}", "{rm,x}", "..", "{1..2}", "~", "~/", "=", ":", "x=", "$", "${IFS}", "$x",
    "$(", ")", "(", "`", ";", "&&", "||", "|", "&", "#", "*", "?", "[a]", "<", ">", "<<EOF\n", "\nEOF", "alias ",
    "command ", "exec ", "eval ", "builtin ", "!", "\\$", "\\`", "\"\\$\"", "\"\\`\"", "\"\\\\\"", "\"\\\n\"", "'\\''",
    "\r", "--", "-la", "a b", "\\ ", "\\;", "\\#", "\\{", "\\}", "'{'", "\\~", "'~'",
];

fn hostile_line() -> impl Strategy<Value = String> {
    (any::<bool>(), prop::collection::vec(prop::sample::select(FRAGMENTS), 0..10)).prop_map(|(lead, parts)| {
        let body: String = parts.concat();
        if lead { format!("ls {body}") } else { body }
    })
}

/// Whatever line is generated from hostile fragments, if `shell(ls *)`
/// accepts it, bash runs only `ls`, with the words the allowlist read.
#[test]
fn accepted_lines_run_only_ls_under_bash() {
    let harness = Harness::new();
    let list = Allowlist::parse(["shell(ls *)"]).unwrap();
    let accepted = std::cell::Cell::new(0usize);
    let config = ProptestConfig { cases: 2000, failure_persistence: None, ..ProptestConfig::default() };
    let mut runner = proptest::test_runner::TestRunner::new(config);
    let result = runner.run(&hostile_line(), |line| {
        if accepts(&list, &line) {
            accepted.set(accepted.get() + 1);
        }
        check_accepted_ls_line(&harness, &list, &line).map_err(TestCaseError::fail)
    });
    if let Err(e) = result {
        panic!("{e}");
    }
    // Enough generated lines got through for the comparison to mean
    // something (about a fifth do).
    eprintln!("{} of 2000 generated lines were accepted and run under bash", accepted.get());
    assert!(accepted.get() >= 200, "only {} generated lines were accepted", accepted.get());
}

proptest! {
    /// Parsing never panics on any printable line, and what it accepts
    /// bash reads the same way (any command, not only `ls`: every word of
    /// every command bash ran was believed).
    #[test]
    fn parsed_words_are_bash_words(line in "[ -~\n\t]{0,30}") {
        thread_local! { static HARNESS: Harness = Harness::new(); }
        if let Ok(believed) = cmdline::parse(&line) {
            let trace = HARNESS.with(|h| h.trace(&line));
            for argv in &trace.executed {
                prop_assert!(believed.contains(argv), "parser read {line:?} as {believed:?}, bash ran {argv:?}");
            }
        }
    }
}
