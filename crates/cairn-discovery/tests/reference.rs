//! Embeddings of fixed sentences against reference values computed once by
//! an independent implementation (`reference/make_reference.py`: its own
//! WordPiece tokenizer and a float64 numpy BERT, the model card's mean
//! pooling and normalisation). Needs the model (`scripts/fetch-minilm`, or
//! CAIRN_MINILM_DIR); without it the test fails saying so.

use cairn_discovery::{EMBEDDING_DIM, Embedder, EmbeddingCache, default_model_dir};

#[derive(serde::Deserialize)]
struct Reference {
    sentences: Vec<Sentence>,
}

#[derive(serde::Deserialize)]
struct Sentence {
    text: String,
    ids: Vec<u32>,
    embedding: Vec<f32>,
}

fn load() -> Embedder {
    let dir = default_model_dir();
    match Embedder::load(&dir, 1) {
        Ok(e) => e,
        Err(e) => panic!("cannot run the reference test: {e}"),
    }
}

fn reference() -> Reference {
    let text = include_str!("reference/reference.json");
    match serde_json::from_str(text) {
        Ok(r) => r,
        Err(e) => panic!("reference.json: {e}"),
    }
}

#[test]
fn embeddings_match_the_independent_reference_within_1e_4() {
    let embedder = load();
    let reference = reference();
    assert!(reference.sentences.len() >= 8);
    // Embedded together (one padded batch) and one at a time: both must match.
    let texts: Vec<&str> = reference.sentences.iter().map(|s| s.text.as_str()).collect();
    let batch = embedder.embed(&texts).unwrap_or_else(|e| panic!("{e}"));
    let mut overall = 0.0f32;
    for (s, got) in reference.sentences.iter().zip(&batch) {
        assert_eq!(embedder.token_ids(&s.text).unwrap_or_else(|e| panic!("{e}")), s.ids, "token ids of {:?}", s.text);
        assert_eq!(got.len(), EMBEDDING_DIM);
        let single = embedder.embed(&[s.text.as_str()]).unwrap_or_else(|e| panic!("{e}"));
        // The request path, computed, then from its in-memory cache.
        let query = embedder.embed_query(&s.text).unwrap_or_else(|e| panic!("{e}"));
        let remembered = embedder.embed_query(&s.text).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(query, remembered, "a remembered request vector is the computed one");
        for (label, v) in [("batched", got), ("alone", &single[0]), ("as a request", &query)] {
            let worst = v.iter().zip(&s.embedding).map(|(a, b)| (a - b).abs()).fold(0.0f32, f32::max);
            assert!(worst < 1e-4, "{label} embedding of {:?} differs by {worst}", s.text);
            overall = overall.max(worst);
            let norm: f32 = v.iter().map(|x| x * x).sum::<f32>().sqrt();
            assert!((norm - 1.0).abs() < 1e-5, "not unit length: {norm}");
        }
    }
    eprintln!("largest difference from the reference: {overall:e}");
}

#[test]
fn the_cache_returns_what_the_model_computed_and_survives_torn_files() {
    let embedder = load();
    let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
    let cache = EmbeddingCache::open(dir.path()).unwrap_or_else(|e| panic!("{e}"));
    let texts = vec!["read a file".to_string(), "delete a branch".to_string()];
    let (first, computed) = cache.embed(&embedder, &texts).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(computed, 2);
    let (again, computed) = cache.embed(&embedder, &texts).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(computed, 0, "a restart must not re-embed unchanged text");
    assert_eq!(first, again);
    // A torn file (half a vector) and a garbage one are re-embedded, not used.
    let torn = dir.path().join(format!("{}.f32", EmbeddingCache::key(&texts[0])));
    std::fs::write(&torn, vec![0u8; 700]).unwrap_or_else(|e| panic!("{e}"));
    let nan = dir.path().join(format!("{}.f32", EmbeddingCache::key(&texts[1])));
    std::fs::write(&nan, f32::NAN.to_le_bytes().repeat(EMBEDDING_DIM)).unwrap_or_else(|e| panic!("{e}"));
    let (third, computed) = cache.embed(&embedder, &texts).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(computed, 2);
    assert_eq!(third, first);
    // Changed text is embedded again; the other is read from the cache.
    let changed = vec!["read a file".to_string(), "delete a remote branch".to_string()];
    let (_, computed) = cache.embed(&embedder, &changed).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(computed, 1);
}
