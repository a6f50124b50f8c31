//! The house stays the way a reader can hold it (after rust-analyzer's
//! `tidy` tests): no source file over 1,000 lines outside tests, a short,
//! explained list of functions of 100 lines or more, and no circle of files
//! that import each other inside the decision core, whose modules read
//! top-down: types → statistics → evidence → policies → safety → state
//! machine → words.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use syn::spanned::Spanned;
use syn::visit::Visit;

/// A source file a reader can hold.
const MAX_FILE_LINES: usize = 1_000;
/// A function a reader can follow without losing the thread.
const MAX_FUNCTION_LINES: usize = 100;

/// The functions kept at 100 lines or more, each with why it reads straight
/// as one piece. At most five; a function that shrank below the limit must
/// leave the list.
const LONG_FUNCTIONS: &[(&str, &str)] = &[];

fn workspace() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// Every `.rs` file under `dir`, sorted.
fn rust_files(dir: &Path) -> Vec<PathBuf> {
    let mut dirs = vec![dir.to_path_buf()];
    let mut files = Vec::new();
    while let Some(dir) = dirs.pop() {
        let Ok(entries) = std::fs::read_dir(&dir) else {
            continue;
        };
        for entry in entries {
            let path = entry.expect("directory entry").path();
            if path.is_dir() {
                dirs.push(path);
            } else if path.extension().is_some_and(|e| e == "rs") {
                files.push(path);
            }
        }
    }
    files.sort();
    files
}

/// The library sources of every crate: `src/`, without unit-test files
/// (`tests.rs`, anything under a `tests/` directory).
fn library_sources() -> Vec<PathBuf> {
    let crates = workspace().join("crates");
    let mut files = Vec::new();
    for entry in std::fs::read_dir(&crates).expect("crates dir") {
        let src = entry.expect("entry").path().join("src");
        files.extend(rust_files(&src).into_iter().filter(|p| {
            p.file_name().is_some_and(|n| n != "tests.rs")
                && !p.components().any(|c| c.as_os_str() == "tests")
        }));
    }
    assert!(files.len() > 50, "too few sources: {}", files.len());
    files
}

fn relative(path: &Path) -> String {
    let root = workspace().canonicalize().expect("workspace");
    let path = path.canonicalize().expect("source path");
    path.strip_prefix(&root)
        .unwrap_or(&path)
        .display()
        .to_string()
}

fn parse(path: &Path) -> syn::File {
    let text = std::fs::read_to_string(path).expect("read source");
    syn::parse_file(&text).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

fn is_test_only(attrs: &[syn::Attribute]) -> bool {
    attrs.iter().any(|a| {
        let path = a.path();
        if path.is_ident("test") {
            return true;
        }
        if !path.is_ident("cfg") {
            return false;
        }
        a.parse_args::<syn::Meta>()
            .is_ok_and(|m| m.path().is_ident("test"))
    })
}

#[test]
fn no_library_source_file_is_over_a_thousand_lines() {
    let long: Vec<String> = library_sources()
        .iter()
        .filter_map(|path| {
            let lines = std::fs::read_to_string(path).expect("read").lines().count();
            (lines > MAX_FILE_LINES).then(|| format!("{} ({lines} lines)", relative(path)))
        })
        .collect();
    assert!(
        long.is_empty(),
        "cut these along their seams (unit tests may move to a `tests.rs` beside them): {long:#?}"
    );
}

/// A `tests.rs` beside a module holds its unit tests: it is left out of the
/// limits above only because its parent declares it `#[cfg(test)]`.
#[test]
fn every_tests_file_is_compiled_for_tests_only() {
    let crates = workspace().join("crates");
    let mut checked = 0;
    for entry in std::fs::read_dir(&crates).expect("crates dir") {
        let src = entry.expect("entry").path().join("src");
        for path in rust_files(&src)
            .into_iter()
            .filter(|p| p.file_name().is_some_and(|n| n == "tests.rs"))
        {
            let dir = path.parent().expect("a parent");
            let parent = [
                dir.with_extension("rs"),
                dir.join("mod.rs"),
                dir.join("lib.rs"),
            ]
            .into_iter()
            .find(|p| p.is_file())
            .unwrap_or_else(|| panic!("{}: no parent module", relative(&path)));
            let text = std::fs::read_to_string(&parent).expect("read parent");
            assert!(
                text.contains("#[cfg(test)]\nmod tests;"),
                "{} must declare `#[cfg(test)] mod tests;`",
                relative(&parent)
            );
            checked += 1;
        }
    }
    assert!(checked >= 1, "no tests.rs found");
}

/// Functions (free, inherent, trait) of library code, with their line counts.
#[derive(Default)]
struct Functions {
    found: Vec<(String, usize)>,
}

impl Functions {
    fn record(&mut self, name: &syn::Ident, span: proc_macro2::Span) {
        let lines = span.end().line - span.start().line + 1;
        self.found.push((name.to_string(), lines));
    }
}

impl<'ast> Visit<'ast> for Functions {
    fn visit_item_mod(&mut self, item: &'ast syn::ItemMod) {
        if !is_test_only(&item.attrs) {
            syn::visit::visit_item_mod(self, item);
        }
    }
    fn visit_item_impl(&mut self, item: &'ast syn::ItemImpl) {
        if !is_test_only(&item.attrs) {
            syn::visit::visit_item_impl(self, item);
        }
    }
    fn visit_item_fn(&mut self, item: &'ast syn::ItemFn) {
        if !is_test_only(&item.attrs) {
            self.record(&item.sig.ident, item.span());
            syn::visit::visit_item_fn(self, item);
        }
    }
    fn visit_impl_item_fn(&mut self, item: &'ast syn::ImplItemFn) {
        if !is_test_only(&item.attrs) {
            self.record(&item.sig.ident, item.span());
            syn::visit::visit_impl_item_fn(self, item);
        }
    }
    fn visit_trait_item_fn(&mut self, item: &'ast syn::TraitItemFn) {
        if item.default.is_some() {
            self.record(&item.sig.ident, item.span());
        }
        syn::visit::visit_trait_item_fn(self, item);
    }
}

/// `path::function` → lines, for every library function of 100 lines or more.
fn long_functions() -> BTreeMap<String, usize> {
    let mut long = BTreeMap::new();
    for path in library_sources() {
        let mut functions = Functions::default();
        functions.visit_file(&parse(&path));
        for (name, lines) in functions.found {
            if lines >= MAX_FUNCTION_LINES {
                long.insert(format!("{}::{name}", relative(&path)), lines);
            }
        }
    }
    long
}

#[test]
fn long_functions_are_few_and_each_says_why() {
    assert!(
        LONG_FUNCTIONS.len() <= 5,
        "at most five long functions: {LONG_FUNCTIONS:?}"
    );
    let long = long_functions();
    let kept: BTreeSet<&str> = LONG_FUNCTIONS.iter().map(|(name, _)| *name).collect();
    let new: Vec<String> = long
        .iter()
        .filter(|(name, _)| !kept.contains(name.as_str()))
        .map(|(name, lines)| format!("{name} ({lines} lines)"))
        .collect();
    assert!(
        new.is_empty(),
        "split these where a reader loses the thread, or keep one in LONG_FUNCTIONS with the reason it reads straight: {new:#?}"
    );
    let gone: Vec<&&str> = kept
        .iter()
        .filter(|name| !long.contains_key(**name))
        .collect();
    assert!(
        gone.is_empty(),
        "no longer long (or renamed): take them off LONG_FUNCTIONS: {gone:?}"
    );
    for (name, why) in LONG_FUNCTIONS {
        assert!(why.len() > 20, "{name}: say why it is kept whole");
    }
}

/// A module of the core: its path from the crate root (`policy::sequential`)
/// and the file that holds it.
fn modules_of(krate: &str) -> BTreeMap<Vec<String>, PathBuf> {
    let src = workspace().join("crates").join(krate).join("src");
    rust_files(&src)
        .into_iter()
        .filter_map(|path| {
            let rel = path.strip_prefix(&src).ok()?.with_extension("");
            let mut segments: Vec<String> = rel
                .components()
                .map(|c| c.as_os_str().to_string_lossy().into_owned())
                .collect();
            if segments
                .last()
                .is_some_and(|s| s == "mod" || s == "lib" || s == "main")
            {
                segments.pop();
            }
            if segments.last().is_some_and(|s| s == "tests") {
                return None;
            }
            Some((segments, path))
        })
        .collect()
}

/// Every path a file names in library code (`use` trees flattened), as
/// segments.
#[derive(Default)]
struct Paths {
    found: Vec<Vec<String>>,
}

impl Paths {
    fn flatten_use(&mut self, prefix: &mut Vec<String>, tree: &syn::UseTree) {
        match tree {
            syn::UseTree::Path(p) => {
                prefix.push(p.ident.to_string());
                self.flatten_use(prefix, &p.tree);
                prefix.pop();
            }
            syn::UseTree::Name(n) => {
                let mut path = prefix.clone();
                path.push(n.ident.to_string());
                self.found.push(path);
            }
            syn::UseTree::Rename(r) => {
                let mut path = prefix.clone();
                path.push(r.ident.to_string());
                self.found.push(path);
            }
            syn::UseTree::Glob(_) => {
                let mut path = prefix.clone();
                path.push("*".into());
                self.found.push(path);
            }
            syn::UseTree::Group(g) => {
                for tree in &g.items {
                    self.flatten_use(prefix, tree);
                }
            }
        }
    }
}

impl<'ast> Visit<'ast> for Paths {
    fn visit_item_mod(&mut self, item: &'ast syn::ItemMod) {
        if !is_test_only(&item.attrs) {
            syn::visit::visit_item_mod(self, item);
        }
    }
    fn visit_item_fn(&mut self, item: &'ast syn::ItemFn) {
        if !is_test_only(&item.attrs) {
            syn::visit::visit_item_fn(self, item);
        }
    }
    fn visit_item_impl(&mut self, item: &'ast syn::ItemImpl) {
        if !is_test_only(&item.attrs) {
            syn::visit::visit_item_impl(self, item);
        }
    }
    fn visit_item_use(&mut self, item: &'ast syn::ItemUse) {
        if !is_test_only(&item.attrs) {
            self.flatten_use(&mut Vec::new(), &item.tree);
        }
    }
    fn visit_path(&mut self, path: &'ast syn::Path) {
        self.found
            .push(path.segments.iter().map(|s| s.ident.to_string()).collect());
        syn::visit::visit_path(self, path);
    }
}

/// The module a path names, from the module `here`: `crate::`, `super::`,
/// `self::` and a child module's name resolve; a name the crate root
/// re-exports resolves to where it is defined; anything else (std, other
/// crates, local items) is no edge.
fn target(
    here: &[String],
    path: &[String],
    modules: &BTreeMap<Vec<String>, PathBuf>,
    reexports: &BTreeMap<String, Vec<String>>,
) -> Option<Vec<String>> {
    // A name the crate root re-exports stands for where it is defined.
    let expanded: Vec<String>;
    let path = match (path.first().map(String::as_str), path.get(1)) {
        (Some("crate"), Some(name)) if reexports.contains_key(name) => {
            expanded = std::iter::once("crate".to_string())
                .chain(reexports[name].iter().cloned())
                .chain(path[1..].iter().cloned())
                .collect();
            &expanded[..]
        }
        _ => path,
    };
    let (mut base, rest): (Vec<String>, &[String]) = match path.first()?.as_str() {
        "crate" => (Vec::new(), &path[1..]),
        "self" => (here.to_vec(), &path[1..]),
        "super" => {
            let mut base = here.to_vec();
            let mut rest = path;
            while rest.first().is_some_and(|s| s == "super") {
                base.pop();
                rest = &rest[1..];
            }
            (base, rest)
        }
        first => {
            let mut child = here.to_vec();
            child.push(first.to_string());
            if !modules.contains_key(&child) {
                return None;
            }
            (here.to_vec(), path)
        }
    };
    // The longest prefix that is a module of its own file.
    let mut found = None;
    for segment in rest {
        base.push(segment.clone());
        if modules.contains_key(&base) {
            found = Some(base.clone());
        } else {
            break;
        }
    }
    found
}

/// What the crate root re-exports: name → the module that defines it.
fn root_reexports(lib: &syn::File) -> BTreeMap<String, Vec<String>> {
    let mut paths = Paths::default();
    for item in &lib.items {
        if let syn::Item::Use(u) = item {
            paths.flatten_use(&mut Vec::new(), &u.tree);
        }
    }
    paths
        .found
        .into_iter()
        .filter_map(|p| {
            let (name, module) = p.split_last()?;
            Some((name.clone(), module.to_vec()))
        })
        .collect()
}

/// Strongly connected components of more than one module (Tarjan).
fn circles(graph: &BTreeMap<Vec<String>, BTreeSet<Vec<String>>>) -> Vec<Vec<String>> {
    struct Search<'g> {
        graph: &'g BTreeMap<Vec<String>, BTreeSet<Vec<String>>>,
        index: BTreeMap<&'g Vec<String>, usize>,
        low: BTreeMap<&'g Vec<String>, usize>,
        stack: Vec<&'g Vec<String>>,
        on_stack: BTreeSet<&'g Vec<String>>,
        found: Vec<Vec<String>>,
    }
    impl<'g> Search<'g> {
        fn visit(&mut self, node: &'g Vec<String>) {
            let n = self.index.len();
            self.index.insert(node, n);
            self.low.insert(node, n);
            self.stack.push(node);
            self.on_stack.insert(node);
            for next in self.graph.get(node).into_iter().flatten() {
                let Some((next, _)) = self.graph.get_key_value(next) else {
                    continue;
                };
                if !self.index.contains_key(next) {
                    self.visit(next);
                    let low = self.low[node].min(self.low[next]);
                    self.low.insert(node, low);
                } else if self.on_stack.contains(next) {
                    let low = self.low[node].min(self.index[next]);
                    self.low.insert(node, low);
                }
            }
            if self.low[node] == self.index[node] {
                let mut component = Vec::new();
                while let Some(top) = self.stack.pop() {
                    self.on_stack.remove(top);
                    component.push(top.join("::"));
                    if top == node {
                        break;
                    }
                }
                if component.len() > 1 {
                    component.sort();
                    self.found.push(component);
                }
            }
        }
    }
    let mut search = Search {
        graph,
        index: BTreeMap::new(),
        low: BTreeMap::new(),
        stack: Vec::new(),
        on_stack: BTreeSet::new(),
        found: Vec::new(),
    };
    for node in graph.keys() {
        if !search.index.contains_key(node) {
            search.visit(node);
        }
    }
    search.found
}

/// Which module of `krate` imports which, in library code. The crate root is a
/// façade (it declares and re-exports), not a node.
fn imports_of(krate: &str) -> BTreeMap<Vec<String>, BTreeSet<Vec<String>>> {
    let modules = modules_of(krate);
    let reexports = root_reexports(&parse(&modules[&Vec::new()]));
    let mut graph = BTreeMap::new();
    for (here, path) in &modules {
        if here.is_empty() {
            continue;
        }
        let mut paths = Paths::default();
        paths.visit_file(&parse(path));
        let edges: BTreeSet<Vec<String>> = paths
            .found
            .iter()
            .filter_map(|p| target(here, p, &modules, &reexports))
            .filter(|t| t != here && !t.is_empty())
            .collect();
        graph.insert(here.clone(), edges);
    }
    graph
}

#[test]
fn the_core_has_no_circle_of_files() {
    let graph = imports_of("rollgate-core");
    // `TIDY_GRAPH=rollgate-store cargo test -p rollgate-core --test suite
    // tidy -- --nocapture` prints who imports whom in that crate.
    if let Some(krate) = std::env::var_os("TIDY_GRAPH") {
        for (module, imports) in &imports_of(&krate.to_string_lossy()) {
            let names: Vec<String> = imports.iter().map(|m| m.join("::")).collect();
            eprintln!("{} -> {}", module.join("::"), names.join(", "));
        }
    }
    assert!(graph.len() > 15, "too few modules: {:?}", graph.keys());
    assert!(
        graph[&vec!["rollout".to_string()]].contains(&vec!["plan".to_string()]),
        "the import graph looks wrong: {graph:?}"
    );
    let circles = circles(&graph);
    assert!(
        circles.is_empty(),
        "modules of rollgate-core that import each other (the core reads top-down: types → statistics → evidence → policies → safety → state machine → words): {circles:#?}"
    );
}

/// The other crates keep their files in one direction too: a circle is
/// where a reader cannot start.
#[test]
fn no_crate_has_a_circle_of_files() {
    let crates = workspace().join("crates");
    let mut found = Vec::new();
    for entry in std::fs::read_dir(&crates).expect("crates dir") {
        let name = entry
            .expect("entry")
            .file_name()
            .to_string_lossy()
            .into_owned();
        for circle in circles(&imports_of(&name)) {
            found.push(format!("{name}: {}", circle.join(" <-> ")));
        }
    }
    found.sort();
    assert!(found.is_empty(), "files that import each other: {found:#?}");
}

/// The check itself finds a circle when there is one.
#[test]
fn a_circle_is_found() {
    let m = |s: &str| vec![s.to_string()];
    let graph = BTreeMap::from([
        (m("a"), BTreeSet::from([m("b")])),
        (m("b"), BTreeSet::from([m("c")])),
        (m("c"), BTreeSet::from([m("a")])),
        (m("d"), BTreeSet::from([m("a")])),
    ]);
    assert_eq!(circles(&graph), vec![vec!["a", "b", "c"]]);
}
