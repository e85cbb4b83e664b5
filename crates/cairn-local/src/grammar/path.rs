//! Path strings in the grammar: a trie of existing candidates for grounded
//! parameters, and the syntax of a working-tree path for the others.
//!
//! A grounded path (`"format": "path"` with `"x-exists"`) is matched against
//! a [`Trie`] of the candidates' JSON spellings (between the quotes), so the
//! string can only close on a whole candidate. A path that may be new
//! (`"format": "path"` alone, as write tools declare) follows
//! [`syntax_step`]: relative, no empty, `.` or `..` components, no
//! backslash escapes.
//!
//! This module must not read the file system (the candidates come from
//! `crate::ground`) nor know about tokens.

/// One trie node: whether a candidate ends here, and the next bytes.
#[derive(Debug, Clone, Default)]
struct TrieNode {
    end: bool,
    /// Sorted by byte.
    next: Vec<(u8, u32)>,
}

/// The candidates' JSON spellings (without quotes), byte by byte.
#[derive(Debug, Clone)]
pub(crate) struct Trie {
    nodes: Vec<TrieNode>,
}

/// The root node of every trie.
pub(crate) const ROOT: u32 = 0;

impl Trie {
    /// A trie of these strings (JSON-encoded here).
    pub(crate) fn new<'a>(paths: impl IntoIterator<Item = &'a str>) -> Self {
        let mut t = Self { nodes: vec![TrieNode::default()] };
        for p in paths {
            let encoded = serde_json::to_vec(p).unwrap_or_default();
            let inner = encoded.get(1..encoded.len().saturating_sub(1)).unwrap_or_default();
            if inner.is_empty() {
                continue;
            }
            let mut at = ROOT;
            for &b in inner {
                at = match t.child(at, b) {
                    Some(n) => n,
                    None => {
                        let id = t.nodes.len() as u32;
                        t.nodes.push(TrieNode::default());
                        if let Some(node) = t.nodes.get_mut(at as usize) {
                            let pos = node.next.partition_point(|(k, _)| *k < b);
                            node.next.insert(pos, (b, id));
                        }
                        id
                    }
                };
            }
            if let Some(node) = t.nodes.get_mut(at as usize) {
                node.end = true;
            }
        }
        t
    }

    /// The node after byte `b` from node `at`.
    pub(crate) fn child(&self, at: u32, b: u8) -> Option<u32> {
        let node = self.nodes.get(at as usize)?;
        node.next.binary_search_by_key(&b, |(k, _)| *k).ok().and_then(|i| node.next.get(i)).map(|(_, n)| *n)
    }

    /// Whether a candidate ends at node `at`.
    pub(crate) fn ends(&self, at: u32) -> bool {
        self.nodes.get(at as usize).is_some_and(|n| n.end)
    }

    /// Number of nodes (a bound on its size).
    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.nodes.len()
    }

    /// Whether the trie holds no candidate.
    pub(crate) fn is_empty(&self) -> bool {
        !self.nodes.iter().any(|n| n.end)
    }
}

/// Where a new path stands in its current component.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Comp {
    /// At the start of a component (the path's start or after `/`).
    Start,
    /// The component so far is `.`.
    Dot,
    /// The component so far is `..`.
    DotDot,
    /// Anything else.
    Name,
}

/// What one byte of a new path does.
pub(crate) enum SyntaxStep {
    /// The closing quote: the path is complete.
    Close,
    /// Still inside, now here.
    Next(Comp),
}

/// One ASCII-level step of a new path (`b` starts a character; UTF-8
/// continuation bytes are checked by the string machinery). `None` refuses:
/// a leading `/`, an empty, `.` or `..` component, a backslash (no escapes
/// in paths), a control byte, or closing on an empty path or a `/`.
pub(crate) fn syntax_step(comp: Comp, b: u8) -> Option<SyntaxStep> {
    match b {
        b'"' => matches!(comp, Comp::Name).then_some(SyntaxStep::Close),
        b'/' => matches!(comp, Comp::Name).then_some(SyntaxStep::Next(Comp::Start)),
        b'.' => Some(SyntaxStep::Next(match comp {
            Comp::Start => Comp::Dot,
            Comp::Dot => Comp::DotDot,
            Comp::DotDot | Comp::Name => Comp::Name,
        })),
        b'\\' | 0..=0x1f | 0x7f => None,
        _ => Some(SyntaxStep::Next(Comp::Name)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn walk(t: &Trie, s: &str) -> Option<u32> {
        s.bytes().try_fold(ROOT, |at, b| t.child(at, b))
    }

    #[test]
    fn trie_matches_whole_candidates() {
        let t = Trie::new(["a.txt", "a.txt.bak", "dir/\"q\".md", ""]);
        assert!(walk(&t, "a.txt").is_some_and(|n| t.ends(n)));
        assert!(walk(&t, "a.tx").is_some_and(|n| !t.ends(n)));
        assert!(walk(&t, "a.txt.bak").is_some_and(|n| t.ends(n)));
        assert!(walk(&t, r#"dir/\"q\".md"#).is_some_and(|n| t.ends(n)), "quotes are matched escaped");
        assert!(walk(&t, "b").is_none());
        assert!(!t.is_empty());
        assert!(Trie::new([""]).is_empty());
    }

    fn syntax_ok(s: &str) -> bool {
        let mut comp = Comp::Start;
        for b in s.bytes().chain([b'"']) {
            match syntax_step(comp, b) {
                Some(SyntaxStep::Next(c)) => comp = c,
                Some(SyntaxStep::Close) => return true,
                None => return false,
            }
        }
        false
    }

    #[test]
    fn new_paths_are_relative_and_clean() {
        for ok in ["a", "a/b.txt", "...", ".env", "a/.b", "x..y/z", "é/ü"] {
            assert!(syntax_ok(ok), "{ok}");
        }
        for bad in ["", "/etc/passwd", "../x", "a/../b", "a//b", "a/", "./a", "a/.", "..", "a\\b", "a\tb"] {
            assert!(!syntax_ok(bad), "{bad}");
        }
    }
}
