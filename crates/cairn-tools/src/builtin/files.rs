//! The read-only built-ins: `read_file` (line ranges, size cap, binary
//! refusal), `list_dir` (gitignore-aware) and `search` (ripgrep's engine,
//! capped matches).
//!
//! They read only inside the working directory and never write anything,
//! and never show anything under cairn's own directories (issue 46: they
//! are hidden from tools, as the sandbox hides them from processes).

use std::fs::File;
use std::io::{BufRead, BufReader, Read};
use std::os::unix::fs::OpenOptionsExt;
use std::path::Path;
use std::time::Instant;

use cairn_core::tool::{
    Capability, ReplayPolicy, Risk, Tool, ToolContext, ToolError, ToolReceipt, ToolRequest, ToolSpec, Validation,
};
use grep_regex::RegexMatcherBuilder;
use grep_searcher::sinks::Lossy;
use grep_searcher::{BinaryDetection, SearcherBuilder};
use serde::Deserialize;
use serde_json::json;

use super::{caps, denied, io, parse_args, receipt};
use crate::ToolsConfig;
use cairn_core::authority::{AuthorityClass, AuthorityRules};

/// Whether the canonical `path` lies under cairn's own directories.
fn hidden(rules: &AuthorityRules, path: &Path) -> bool {
    path.to_str().and_then(|p| rules.classify(Path::new(""), p)).is_some_and(|a| a.class == AuthorityClass::CairnHome)
}

/// Refuse the canonical `path` (given as `given`) when it is hidden.
fn refuse_hidden(rules: &AuthorityRules, path: &Path, given: &str) -> Result<(), ToolError> {
    if hidden(rules, path) {
        return Err(ToolError::AccessDenied(format!(
            "{given} is under cairn's own configuration or data, which is hidden from tools: read it yourself outside cairn"
        )));
    }
    Ok(())
}
use crate::paths::{display_rel, resolve_in_cwd};

fn read_only_spec(name: &str, description: &str, schema: serde_json::Value) -> ToolSpec {
    ToolSpec {
        name: name.into(),
        description: description.into(),
        input_schema: schema,
        risk: Risk::ReadOnly,
        capabilities: caps(&[Capability::FileRead]),
        replay: ReplayPolicy::Idempotent,
    }
}

fn open_nofollow(path: &Path) -> Result<File, ToolError> {
    std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW)
        .open(path)
        .map_err(io(format!("cannot open {}", path.display())))
}

/// Longest line `read_file` shows whole (bytes).
const MAX_READ_LINE: usize = 2000;

/// `read_file {path, offset?, limit?}`.
#[derive(Debug)]
pub struct ReadFile {
    spec: ToolSpec,
    max_bytes: u64,
    default_lines: usize,
    authority: AuthorityRules,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct ReadArgs {
    path: String,
    offset: Option<u64>,
    limit: Option<u64>,
}

impl ReadFile {
    /// The tool with the configured caps.
    pub fn new(config: &ToolsConfig) -> Self {
        let spec = read_only_spec(
            "read_file",
            "Read a text file in the working directory. Lines are numbered. Use offset (first line, 1-based) and \
             limit (number of lines) to read part of a large file. Binary files are refused.",
            json!({
                "type": "object",
                "properties": {
                    "path": {"type": "string", "format": "path", "x-exists": "file", "description": "File path relative to the working directory"},
                    "offset": {"type": "integer", "minimum": 1, "description": "First line to read (1-based)"},
                    "limit": {"type": "integer", "minimum": 1, "description": "Number of lines to read"}
                },
                "required": ["path"],
                "additionalProperties": false
            }),
        );
        Self {
            spec,
            max_bytes: config.read_max_bytes,
            default_lines: config.read_default_lines,
            authority: config.authority.clone(),
        }
    }
}

fn binary_refusal(path: &str) -> ToolError {
    ToolError::InvalidArguments(format!(
        "{path} is a binary file (not UTF-8 text); read_file only shows text. Use shell tools such as `file` or `xxd` if you must inspect it"
    ))
}

impl Tool for ReadFile {
    fn spec(&self) -> &ToolSpec {
        &self.spec
    }

    fn validate(&self, request: &ToolRequest) -> Validation {
        match parse_args::<ReadArgs>(request) {
            Ok(a) if a.offset == Some(0) => Validation::Invalid("offset is 1-based: the first line is 1".into()),
            Ok(a) if a.limit == Some(0) => Validation::Invalid("limit must be at least 1".into()),
            Ok(_) => Validation::Valid,
            Err(e) => Validation::Invalid(e),
        }
    }

    fn execute(&self, request: &ToolRequest, ctx: &mut ToolContext<'_>) -> Result<ToolReceipt, ToolError> {
        let start = Instant::now();
        let args: ReadArgs = parse_args(request).map_err(ToolError::InvalidArguments)?;
        let path = resolve_in_cwd(ctx.cwd, &args.path).map_err(denied)?;
        refuse_hidden(&self.authority, &path, &args.path)?;
        let meta = std::fs::metadata(&path).map_err(io(format!("cannot read {}", args.path)))?;
        if meta.is_dir() {
            return Err(ToolError::InvalidArguments(format!("{} is a directory: use list_dir", args.path)));
        }
        if !meta.is_file() {
            return Err(ToolError::InvalidArguments(format!(
                "{} is not a regular file (a pipe, socket or device): read_file reads regular files only",
                args.path
            )));
        }
        let ranged = args.offset.is_some() || args.limit.is_some();
        if !ranged && meta.len() > self.max_bytes {
            return Err(ToolError::InvalidArguments(format!(
                "{} is {} bytes, more than the {}-byte read cap: read a range with offset and limit, or use search",
                args.path,
                meta.len(),
                self.max_bytes
            )));
        }
        let mut file = open_nofollow(&path)?;
        let mut head = [0u8; 8192];
        let n = file.read(&mut head).map_err(io(format!("cannot read {}", args.path)))?;
        if head[..n].contains(&0) {
            return Err(binary_refusal(&args.path));
        }
        let file = open_nofollow(&path)?;
        let first = args.offset.unwrap_or(1).max(1);
        let limit = args.limit.unwrap_or(self.default_lines as u64);
        let last = first.saturating_add(limit);
        let mut reader = BufReader::new(file);
        let mut line = Vec::new();
        let mut out = String::new();
        let mut number: u64 = 0;
        let mut shown = 0u64;
        let cap = ctx.limits.output_cap;
        // Room for the note saying where to read on: a range that does not
        // fit in one answer ends at a whole line, never cut by the cap.
        let budget = cap.saturating_sub(256);
        // The first line left out because the answer was full.
        let mut cut_at: Option<u64> = None;
        loop {
            line.clear();
            let read = reader.read_until(b'\n', &mut line).map_err(io(format!("cannot read {}", args.path)))?;
            if read == 0 {
                break;
            }
            number += 1;
            if number < first || number >= last || cut_at.is_some() {
                continue;
            }
            let text = std::str::from_utf8(&line).map_err(|_| binary_refusal(&args.path))?;
            let text = text.trim_end_matches(['\n', '\r']);
            let shown_line = if text.len() > MAX_READ_LINE {
                let mut end = MAX_READ_LINE;
                while !text.is_char_boundary(end) {
                    end -= 1;
                }
                format!("{number:>6}\t{}… [line cut at {end} of {} bytes]\n", &text[..end], text.len())
            } else {
                format!("{number:>6}\t{text}\n")
            };
            if shown > 0 && out.len() + shown_line.len() > budget {
                cut_at = Some(number);
                continue;
            }
            out.push_str(&shown_line);
            shown += 1;
        }
        if let Some(next) = cut_at {
            out.push_str(&format!(
                "[the answer is full: lines {first}–{} of {number} shown (the file is {} bytes); read on with offset={next}]\n",
                next - 1,
                meta.len()
            ));
        } else if number >= last {
            out.push_str(&format!("[{} more lines; read on with offset={last}]\n", number - last + 1));
        }
        if number == 0 {
            out.push_str("[empty file]\n");
        } else if first > number {
            out.push_str(&format!("[the file has only {number} lines]\n"));
        }
        (ctx.output)(out.as_bytes());
        let structured = json!({
            "path": display_rel(ctx.cwd, &path),
            "firstLine": first,
            "linesShown": shown,
            "totalLines": number,
            "bytes": meta.len(),
            "nextOffset": cut_at.or((number >= last).then_some(last)),
        });
        Ok(receipt(start, Risk::ReadOnly, out, cap, Some(structured), vec![display_rel(ctx.cwd, &path)]))
    }
}

/// `list_dir {path?}`: one level, gitignore-aware.
#[derive(Debug)]
pub struct ListDir {
    spec: ToolSpec,
    max_entries: usize,
    authority: AuthorityRules,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct ListArgs {
    path: Option<String>,
}

impl ListDir {
    /// The tool with the configured cap.
    pub fn new(config: &ToolsConfig) -> Self {
        let spec = read_only_spec(
            "list_dir",
            "List a directory in the working directory (one level; entries ignored by .gitignore are hidden; \
             directories end with '/').",
            json!({
                "type": "object",
                "properties": {
                    "path": {"type": "string", "format": "path", "x-exists": "directory", "description": "Directory relative to the working directory (default: the working directory)"}
                },
                "additionalProperties": false
            }),
        );
        Self { spec, max_entries: config.list_max_entries, authority: config.authority.clone() }
    }
}

impl Tool for ListDir {
    fn spec(&self) -> &ToolSpec {
        &self.spec
    }

    fn validate(&self, request: &ToolRequest) -> Validation {
        match parse_args::<ListArgs>(request) {
            Ok(_) => Validation::Valid,
            Err(e) => Validation::Invalid(e),
        }
    }

    fn execute(&self, request: &ToolRequest, ctx: &mut ToolContext<'_>) -> Result<ToolReceipt, ToolError> {
        let start = Instant::now();
        let args: ListArgs = parse_args(request).map_err(ToolError::InvalidArguments)?;
        let given = args.path.unwrap_or_else(|| ".".into());
        let dir = resolve_in_cwd(ctx.cwd, &given).map_err(denied)?;
        refuse_hidden(&self.authority, &dir, &given)?;
        if !dir.is_dir() {
            return Err(ToolError::InvalidArguments(format!("{given} is not a directory: use read_file for files")));
        }
        let authority = self.authority.clone();
        let walker = ignore::WalkBuilder::new(&dir)
            .max_depth(Some(1))
            .hidden(false)
            .require_git(false)
            .follow_links(false)
            .filter_entry(move |e| e.file_name() != ".git" && !hidden(&authority, e.path()))
            .build();
        let mut entries = Vec::new();
        for entry in walker.flatten() {
            if entry.depth() == 0 {
                continue;
            }
            let mut name = entry.file_name().to_string_lossy().into_owned();
            if entry.file_type().is_some_and(|t| t.is_dir()) {
                name.push('/');
            } else if entry.path_is_symlink() {
                name.push('@');
            }
            entries.push(name);
        }
        entries.sort();
        let total = entries.len();
        entries.truncate(self.max_entries);
        let mut out = entries.join("\n");
        out.push('\n');
        if total > entries.len() {
            out.push_str(&format!("[{} more entries not shown]\n", total - entries.len()));
        }
        if total == 0 {
            out = "[empty directory]\n".into();
        }
        (ctx.output)(out.as_bytes());
        let structured = json!({"path": display_rel(ctx.cwd, &dir), "entries": entries, "total": total});
        Ok(receipt(start, Risk::ReadOnly, out, ctx.limits.output_cap, Some(structured), vec![]))
    }
}

/// `search {pattern, path?}`: regex over the tree with ripgrep's crates.
#[derive(Debug)]
pub struct Search {
    spec: ToolSpec,
    max_matches: usize,
    authority: AuthorityRules,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct SearchArgs {
    pattern: String,
    path: Option<String>,
}

const MAX_LINE: usize = 400;

/// One search hit: relative path, line number, line text.
pub type SearchMatch = (String, u64, String);

impl Search {
    /// The tool with the configured cap.
    pub fn new(config: &ToolsConfig) -> Self {
        let spec = read_only_spec(
            "search",
            "Search files under a path in the working directory for a regular expression (Rust regex syntax). \
             Respects .gitignore, skips hidden and binary files. Prints path:line:text.",
            json!({
                "type": "object",
                "properties": {
                    "pattern": {"type": "string", "description": "Regular expression"},
                    "path": {"type": "string", "format": "path", "x-exists": true, "description": "File or directory to search (default: the working directory)"}
                },
                "required": ["pattern"],
                "additionalProperties": false
            }),
        );
        Self { spec, max_matches: config.search_max_matches, authority: config.authority.clone() }
    }

    /// Run a search outside the `Tool` plumbing: `(matches, truncated)`.
    /// Each match is `(relative path, line number, line text)`.
    pub fn search(&self, cwd: &Path, pattern: &str, path: Option<&str>) -> Result<(Vec<SearchMatch>, bool), ToolError> {
        let root = resolve_in_cwd(cwd, path.unwrap_or(".")).map_err(denied)?;
        refuse_hidden(&self.authority, &root, path.unwrap_or("."))?;
        let matcher = RegexMatcherBuilder::new()
            .line_terminator(Some(b'\n'))
            .build(pattern)
            .map_err(|e| ToolError::InvalidArguments(format!("invalid regex: {e}")))?;
        let mut searcher = SearcherBuilder::new().binary_detection(BinaryDetection::quit(0)).line_number(true).build();
        let authority = self.authority.clone();
        let walker = ignore::WalkBuilder::new(&root)
            .require_git(false)
            .follow_links(false)
            .filter_entry(move |e| !hidden(&authority, e.path()))
            .build();
        let mut matches = Vec::new();
        let mut truncated = false;
        for entry in walker.flatten() {
            if !entry.file_type().is_some_and(|t| t.is_file()) {
                continue;
            }
            let rel = display_rel(cwd, entry.path());
            let max = self.max_matches;
            let result = searcher.search_path(
                &matcher,
                entry.path(),
                Lossy(|line_number, line| {
                    if matches.len() >= max {
                        truncated = true;
                        return Ok(false);
                    }
                    let mut text = line.trim_end_matches(['\n', '\r']).to_string();
                    if text.len() > MAX_LINE {
                        let mut end = MAX_LINE;
                        while !text.is_char_boundary(end) {
                            end -= 1;
                        }
                        text.truncate(end);
                        text.push('…');
                    }
                    matches.push((rel.clone(), line_number, text));
                    Ok(true)
                }),
            );
            // Unreadable files are skipped, as ripgrep does.
            let _ = result;
            if truncated {
                break;
            }
        }
        Ok((matches, truncated))
    }
}

impl Tool for Search {
    fn spec(&self) -> &ToolSpec {
        &self.spec
    }

    fn validate(&self, request: &ToolRequest) -> Validation {
        match parse_args::<SearchArgs>(request) {
            Ok(a) => match RegexMatcherBuilder::new().build(&a.pattern) {
                Ok(_) => Validation::Valid,
                Err(e) => Validation::Invalid(format!("invalid regex {:?}: {e}", a.pattern)),
            },
            Err(e) => Validation::Invalid(e),
        }
    }

    fn execute(&self, request: &ToolRequest, ctx: &mut ToolContext<'_>) -> Result<ToolReceipt, ToolError> {
        let start = Instant::now();
        let args: SearchArgs = parse_args(request).map_err(ToolError::InvalidArguments)?;
        let (matches, truncated) = self.search(ctx.cwd, &args.pattern, args.path.as_deref())?;
        let mut out = String::new();
        for (path, line, text) in &matches {
            out.push_str(&format!("{path}:{line}:{text}\n"));
        }
        if matches.is_empty() {
            out.push_str("[no matches]\n");
        }
        if truncated {
            out.push_str(&format!("[stopped at {} matches: narrow the pattern or the path]\n", self.max_matches));
        }
        (ctx.output)(out.as_bytes());
        let structured = json!({"matches": matches.len(), "truncated": truncated});
        let mut r = receipt(start, Risk::ReadOnly, out, ctx.limits.output_cap, Some(structured), vec![]);
        r.truncated |= truncated;
        Ok(r)
    }
}
