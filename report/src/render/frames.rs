//! How text views show a stack: the program's own frames first. Frames of the machinery
//! between them (the CPython interpreter, libffi, pybind11, the C++ runtime, PyTorch's C++
//! allocator, ATen and dispatcher, and PyTorch's own `Module.__call__` wrappers) are folded,
//! so that `model.py:42 in forward` shows within the first few frames instead of after 30
//! frames of `c10::`, `at::` and `_PyEval_*`. The frames where a process or thread began
//! (`_start`, `start_thread`) are folded the same way, and a C++ function whose demangled name
//! is too long for a line shows with its parameters (then its template arguments) elided:
//! `AddmmBackward0_apply_functional(...)`. `--unfold` shows every frame, each name whole. JSON,
//! flame graphs and exports always keep every frame and every name as symbolised.

use std::borrow::Cow;

use rustc_hash::FxHashMap;

use crate::analysis::groups::{GroupThread, TreeNode, place};
use crate::python::{EVAL_LOOP, PYTHON_MODULE};
use crate::symbols::SymFrame;

/// Which frames a text view shows: the commands that print stacks take it from `--unfold`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Fold {
    /// The machinery's frames folded (the default).
    #[default]
    Machinery,
    /// Every frame shown, each name whole (`--unfold`).
    Nothing,
}

/// What a folded frame belongs to, or `None` for a frame shown.
pub fn machinery(frame: &SymFrame) -> Option<&'static str> {
    let function = frame.function.as_deref().unwrap_or("");
    if &*frame.module == PYTHON_MODULE {
        let file = frame.file.as_deref().unwrap_or("");
        let torch_wrapper = (file.ends_with("torch/nn/modules/module.py")
            && matches!(function, "Module._call_impl" | "Module._wrapped_call_impl"))
            || file.ends_with("torch/utils/_contextlib.py")
            || (file.ends_with("torch/optim/optimizer.py")
                && (function.ends_with(".wrapper") || function.ends_with("._use_grad")));
        return if torch_wrapper {
            Some("PyTorch")
        } else if file.starts_with("<frozen ") {
            Some("CPython")
        } else {
            None
        };
    }
    if is_start(frame) {
        return Some("libc");
    }
    let module = frame.module.rsplit('/').next().unwrap_or("");
    if module.starts_with("libpython")
        || module == "python"
        || module.starts_with("python2")
        || module.starts_with("python3")
        // ctypes' extension module (its call into libffi).
        || module.starts_with("_ctypes")
        || function == EVAL_LOOP
    {
        Some("CPython")
    } else if module.starts_with("libffi.so") || function.starts_with("ffi_call") {
        Some("libffi")
    } else if function.starts_with("pybind11::") {
        Some("pybind11")
    } else if function.starts_with("torch::autograd::generated::") && function.contains("Backward")
    {
        // The backward of which operation: the frame a user can place.
        None
    } else if module.starts_with("libtorch")
        || module.starts_with("libc10")
        || frame.module.contains("/torch/lib/")
        || (module.starts_with("_C.") && frame.module.contains("/torch/"))
        || ["c10::", "at::", "torch::"]
            .iter()
            .any(|prefix| function.starts_with(prefix))
    {
        Some("PyTorch")
    } else if module.starts_with("libstdc++.so") {
        Some("C++ runtime")
    } else {
        None
    }
}

/// How wide a C++ function's name may be in a text view before its parameters, then its
/// template arguments, are elided (a demangled ATen name runs to 500 characters).
const NAME_WIDTH: usize = 80;

/// A frame's label as text views print it: [`SymFrame::label`], with a native function's name
/// shortened by [`short_name`] unless `fold` is `Fold::Nothing` (`--unfold`).
pub fn text_label(frame: &SymFrame, fold: Fold) -> String {
    match frame.function.as_deref() {
        Some(function) if fold == Fold::Machinery && &*frame.module != PYTHON_MODULE => {
            match short_name(function) {
                Cow::Borrowed(_) => frame.label(),
                Cow::Owned(short) => SymFrame {
                    function: Some(short.into()),
                    ..frame.clone()
                }
                .label(),
            }
        }
        _ => frame.label(),
    }
}

/// A demangled C++ name no wider than [`NAME_WIDTH`] where eliding can make it so: first the
/// parameter list (`f(...)`), then the outermost template argument lists (`f<...>`). Names
/// that fit, and names whose brackets do not balance, are returned as they are.
pub fn short_name(name: &str) -> Cow<'_, str> {
    if name.len() <= NAME_WIDTH {
        return Cow::Borrowed(name);
    }
    let mut short = elide_parameters(name).unwrap_or_else(|| name.to_string());
    if short.len() > NAME_WIDTH
        && let Some(fewer) = elide_template_arguments(&short)
    {
        short = fewer;
    }
    if short == name {
        Cow::Borrowed(name)
    } else {
        Cow::Owned(short)
    }
}

/// `name` with its parameter list elided (`f(int, long) const` → `f(...) const`), or `None`
/// when it has none that balances.
fn elide_parameters(name: &str) -> Option<String> {
    // What may follow the parameter list: GCC's clone suffixes and the qualifiers of a member.
    let mut core = name;
    loop {
        let before = core;
        if core.ends_with(']')
            && let Some(at) = core.rfind(" [clone ")
        {
            core = &core[..at];
        }
        for qualifier in [" const", " volatile", " &&", " &", " noexcept"] {
            if let Some(rest) = core.strip_suffix(qualifier) {
                core = rest;
            }
        }
        if core == before {
            break;
        }
    }
    let close = core.len().checked_sub(1).filter(|_| core.ends_with(')'))?;
    let mut depth = 0usize;
    for (at, byte) in core.bytes().enumerate().rev() {
        match byte {
            b')' => depth += 1,
            b'(' => {
                depth = depth.checked_sub(1)?;
                if depth == 0 {
                    if close - at <= 1 || &core[at + 1..close] == "..." {
                        return None;
                    }
                    return Some(format!("{}(...){}", &core[..at], &name[close..][1..]));
                }
            }
            _ => {}
        }
    }
    None
}

/// `name` with every outermost template argument list elided (`f<int>::g` → `f<...>::g`),
/// leaving `operator<`, `operator<<`, `operator->` and the like alone; `None` when a list does
/// not balance.
fn elide_template_arguments(name: &str) -> Option<String> {
    let bytes = name.as_bytes();
    let mut out = String::with_capacity(name.len());
    let mut at = 0;
    let mut copied = 0;
    while at < bytes.len() {
        let opens = bytes[at] == b'<'
            && !name[..at].ends_with("operator")
            && !name[..at].ends_with("operator<");
        if !opens {
            at += 1;
            continue;
        }
        // The matching '>': angle brackets counted outside parentheses (`f<void (int)>`), and
        // a '-' before '>' is an arrow, not a bracket.
        let (mut angle, mut paren, mut end) = (0usize, 0usize, None);
        for (offset, &byte) in bytes[at..].iter().enumerate() {
            match byte {
                b'(' => paren += 1,
                b')' => paren = paren.checked_sub(1)?,
                b'<' if paren == 0 => angle += 1,
                b'>' if paren == 0 && bytes[at + offset - 1] != b'-' => {
                    angle -= 1;
                    if angle == 0 {
                        end = Some(at + offset);
                        break;
                    }
                }
                _ => {}
            }
        }
        let end = end?;
        out.push_str(&name[copied..at]);
        out.push_str(if end - at > 1 { "<...>" } else { "<>" });
        at = end + 1;
        copied = at;
    }
    out.push_str(&name[copied..]);
    Some(out)
}

/// Where every process or thread begins (libc), never what allocated.
fn is_start(frame: &SymFrame) -> bool {
    matches!(
        frame.function.as_deref(),
        Some(
            "_start"
                | "__libc_start_main"
                | "__libc_start_main_impl"
                | "__libc_start_call_main"
                | "start_thread"
                | "clone"
                | "clone3"
        )
    )
}

/// A node of the caller → callee tree as a text view shows it: the recorded tree's nodes that
/// folding brings to one place under one parent (one node when nothing is folded on the way).
/// Two folded paths to the same frame (`forward` → [PyTorch] → `alloc` twice, through other
/// ATen functions) show as one node, with the bytes and counts of both.
pub struct ShownNode<'a> {
    /// The same place (or the same thread node) each; never empty.
    nodes: Vec<&'a TreeNode>,
    pub bytes: u64,
    pub count: u64,
}

impl<'a> ShownNode<'a> {
    /// One recorded node as it is (a tree's root, or a child nothing was merged with).
    pub fn root(node: &'a TreeNode) -> ShownNode<'a> {
        ShownNode {
            nodes: vec![node],
            bytes: node.bytes,
            count: node.count,
        }
    }

    /// The node's frame; `None` at the root and at thread nodes.
    pub fn frame(&self) -> Option<&'a SymFrame> {
        self.nodes[0].frame.as_deref()
    }

    /// The thread of a thread node (top level, when groups are split by thread).
    pub fn thread(&self) -> Option<&'a GroupThread> {
        self.nodes[0].thread.as_deref()
    }

    /// The children a text tree shows under this node, largest first. With `Fold::Machinery`
    /// a child that is machinery (and not a leaf, so every branch still ends in the frame that
    /// allocated) gives way to its own children, recursively, and the children then at the
    /// same place are one. With `Fold::Nothing`, the recorded children.
    pub fn children(&self, fold: Fold) -> Vec<ShownNode<'a>> {
        fn expand<'a>(node: &'a TreeNode, fold: Fold, out: &mut Vec<&'a TreeNode>) {
            for child in &node.children {
                let folded = fold == Fold::Machinery
                    && !child.children.is_empty()
                    && child
                        .frame
                        .as_deref()
                        .is_some_and(|frame| machinery(frame).is_some());
                if folded {
                    expand(child, fold, out);
                } else {
                    out.push(child);
                }
            }
        }
        let mut reached = Vec::new();
        for node in &self.nodes {
            expand(node, fold, &mut reached);
        }
        let mut shown: Vec<ShownNode<'a>> = Vec::with_capacity(reached.len());
        // Thread nodes (no frame) are each their own: the tree made one per thread.
        let mut at_place = FxHashMap::default();
        for node in reached {
            let same = node
                .frame
                .as_deref()
                .and_then(|frame| at_place.get(&place(frame)).copied());
            match same {
                Some(index) => {
                    let merged: &mut ShownNode<'a> = &mut shown[index];
                    merged.nodes.push(node);
                    merged.bytes = merged.bytes.saturating_add(node.bytes);
                    merged.count = merged.count.saturating_add(node.count);
                }
                None => {
                    if let Some(frame) = node.frame.as_deref() {
                        at_place.insert(place(frame), shown.len());
                    }
                    shown.push(ShownNode::root(node));
                }
            }
        }
        // Stable: equal sizes keep the tree's order.
        shown.sort_by_key(|node| std::cmp::Reverse(node.bytes));
        shown
    }
}

/// A stack as a text view shows it.
pub struct Shown<'a> {
    /// Frames folded before the first one shown (the innermost run), and what they belong to.
    pub leading: (usize, Vec<&'static str>),
    /// The frames shown, innermost first.
    pub frames: Vec<&'a SymFrame>,
    /// Every frame folded, the leading ones included.
    pub folded: usize,
}

impl Shown<'_> {
    /// The line standing for the leading folded frames: `[23 frames of PyTorch, CPython]`.
    pub fn leading_line(&self) -> Option<String> {
        let (count, kinds) = &self.leading;
        (*count > 0).then(|| {
            let plural = if *count == 1 { "" } else { "s" };
            format!("[{count} frame{plural} of {} folded]", kinds.join(", "))
        })
    }

    /// The line after the first `limit` frames shown: how many more there are and how many
    /// were folded after the leading run (`... 3 more frames, 40 folded (--unfold shows every
    /// frame)`), or `None` when nothing is left out.
    pub fn rest_line(&self, limit: usize) -> Option<String> {
        let more = self.frames.len().saturating_sub(limit);
        let folded = self.folded - self.leading.0;
        let more_text = crate::units::counted(more as u64, "more frame");
        match (more, folded) {
            (0, 0) => None,
            (_, 0) if self.folded == 0 => Some(format!("... {more_text}")),
            (_, 0) => Some(format!("... {more_text} (--unfold shows every frame)")),
            (0, _) => Some(format!(
                "... {folded} frame{} folded (--unfold shows every frame)",
                if folded == 1 { "" } else { "s" }
            )),
            _ => Some(format!(
                "... {more_text}, {folded} folded (--unfold shows every frame)"
            )),
        }
    }
}

/// `frames` (innermost first) as text views show them: machinery folded unless `fold` is
/// `Fold::Nothing` (`--unfold`), or when nothing else would be left.
pub fn shown(frames: &[SymFrame], fold: Fold) -> Shown<'_> {
    let kinds: Vec<Option<&'static str>> = if fold == Fold::Nothing {
        vec![None; frames.len()]
    } else {
        frames.iter().map(machinery).collect()
    };
    // Folding that would leave only where the process or thread began (an autograd thread's
    // allocation) hides the only frames that say anything: then nothing is folded.
    let nothing_left = frames
        .iter()
        .zip(&kinds)
        .all(|(frame, kind)| kind.is_some() || is_start(frame));
    if nothing_left {
        return Shown {
            leading: (0, Vec::new()),
            frames: frames.iter().collect(),
            folded: 0,
        };
    }
    let mut leading = (0, Vec::new());
    for kind in kinds.iter().map_while(|kind| *kind) {
        leading.0 += 1;
        if !leading.1.contains(&kind) {
            leading.1.push(kind);
        }
    }
    Shown {
        leading,
        frames: frames
            .iter()
            .zip(&kinds)
            .filter(|(_, kind)| kind.is_none())
            .map(|(frame, _)| frame)
            .collect(),
        folded: kinds.iter().filter(|kind| kind.is_some()).count(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn native(function: &str, module: &str) -> SymFrame {
        SymFrame {
            function: Some(function.into()),
            file: None,
            line: None,
            module: module.into(),
            offset: 0,
            inlined: false,
        }
    }

    fn python(function: &str, file: &str, line: u32) -> SymFrame {
        SymFrame {
            function: Some(function.into()),
            file: Some(file.into()),
            line: Some(line),
            module: PYTHON_MODULE.into(),
            offset: 0,
            inlined: false,
        }
    }

    #[test]
    fn frames_fold_machinery_and_keep_the_programs_own() {
        let torch = "/venv/lib/python3.12/site-packages/torch/lib/libc10_cuda.so";
        let frames = vec![
            native(
                "c10::cuda::CUDACachingAllocator::Native::uncached_allocate(unsigned long)",
                torch,
            ),
            native(
                "at::native::relu(at::Tensor const&)",
                "/venv/torch/lib/libtorch_cpu.so",
            ),
            native(
                "torch::autograd::THPVariable_relu(_object*, _object*, _object*)",
                "/venv/torch/lib/libtorch_python.so",
            ),
            native("cfunction_call", "/usr/bin/python3.12"),
            python("Mlp.forward", "/work/model.py", 42),
            native("_PyEval_EvalFrameDefault", "/usr/lib/libpython3.12.so.1.0"),
            python(
                "Module._call_impl",
                "/venv/torch/nn/modules/module.py",
                1798,
            ),
            python("train", "/work/train.py", 9),
            native("main", "/usr/bin/python3.12"),
            native("__libc_start_call_main", "/lib/libc.so.6"),
        ];
        let shown = shown(&frames, Fold::Machinery);
        let labels: Vec<String> = shown.frames.iter().map(|f| f.label()).collect();
        assert_eq!(labels, ["Mlp.forward (model.py:42)", "train (train.py:9)"]);
        assert_eq!(
            shown.leading_line().as_deref(),
            Some("[4 frames of PyTorch, CPython folded]")
        );
        assert_eq!(shown.folded, 8);
        assert_eq!(
            shown.rest_line(1).as_deref(),
            Some("... 1 more frame, 4 folded (--unfold shows every frame)")
        );
        assert_eq!(
            shown.rest_line(8).as_deref(),
            Some("... 4 frames folded (--unfold shows every frame)")
        );
        let all = super::shown(&frames, Fold::Nothing);
        assert_eq!(all.frames.len(), frames.len());
        assert_eq!(all.leading_line(), None);
        assert_eq!(all.rest_line(8).as_deref(), Some("... 2 more frames"));
        // Nothing but machinery, or machinery and where a thread began: every frame shown.
        let only = super::shown(&frames[..4], Fold::Machinery);
        assert_eq!(only.frames.len(), 4);
        assert_eq!(only.folded, 0);
        let mut thread = frames[..4].to_vec();
        thread.push(native("start_thread", "/lib/libc.so.6"));
        let thread_shown = super::shown(&thread, Fold::Machinery);
        assert_eq!(thread_shown.frames.len(), 5);
        assert_eq!(thread_shown.leading_line(), None);
    }

    #[test]
    fn long_cpp_names_are_elided_in_text_and_whole_when_unfolded() {
        // Names PyTorch 2.15's libraries give (demangled), and what text views print.
        let backward = "torch::autograd::generated::AddmmBackward0_apply_functional(\
            std::vector<at::Tensor, std::allocator<at::Tensor> >&&, std::array<bool, \
            (unsigned long)3>, c10::Scalar&, c10::Scalar&, at::Tensor&, c10::Layout&)";
        assert_eq!(
            short_name(backward),
            "torch::autograd::generated::AddmmBackward0_apply_functional(...)"
        );
        let wrapper = "c10::impl::wrap_kernel_functor_unboxed_<c10::impl::detail::\
            WrapFunctionIntoFunctor_<c10::CompileTimeFunctionPointer<at::Tensor (c10::\
            ArrayRef<c10::SymInt>, std::optional<c10::ScalarType>), &at::(anonymous \
            namespace)::wrapper_CUDA_empty_memory_format>, at::Tensor, c10::guts::\
            typelist::typelist<c10::ArrayRef<c10::SymInt> > >, at::Tensor (c10::ArrayRef<\
            c10::SymInt>)>::call(c10::OperatorKernel*, c10::DispatchKeySet, c10::ArrayRef<\
            c10::SymInt>) const [clone .cold]";
        assert_eq!(
            short_name(wrapper),
            "c10::impl::wrap_kernel_functor_unboxed_<...>::call(...) const [clone .cold]"
        );
        // Short names, operators and unbalanced names stay as they are.
        for name in [
            "c10::cuda::CUDACachingAllocator::Native::uncached_allocate(unsigned long)",
            "bool std::operator< <int, std::allocator<int> >(std::vector<int, std::allocator<\
             int> > const&, std::vector<int, std::allocator<int> > const&)",
            "a_name_with_no_brackets_that_is_longer_than_eighty_characters_and_then_some_more",
            "f(((((((((((((((((((((((((((((((((((((((((((((((((((((((((((((((((((((((((((",
        ] {
            let short = short_name(name);
            if name.starts_with("bool std::operator<") {
                // Fits once the parameters are elided: the template arguments stay.
                assert_eq!(
                    short,
                    "bool std::operator< <int, std::allocator<int> >(...)"
                );
            } else {
                assert_eq!(short, name);
            }
        }
        assert_eq!(
            elide_template_arguments("std::operator< <int>(a) -> b<c>::operator<<<d>").as_deref(),
            Some("std::operator< <...>(a) -> b<...>::operator<<<...>")
        );
        assert_eq!(elide_template_arguments("f<g<h>(x)"), None);
        let frame = |function: &str, module: &str| SymFrame {
            function: Some(function.into()),
            file: Some("/src/functions_0.cpp".into()),
            line: Some(3),
            module: module.into(),
            offset: 0,
            inlined: false,
        };
        let native = frame(backward, "/venv/torch/lib/libtorch_cpu.so");
        assert_eq!(
            text_label(&native, Fold::Machinery),
            "torch::autograd::generated::AddmmBackward0_apply_functional(...) (functions_0.cpp:3)"
        );
        assert_eq!(text_label(&native, Fold::Nothing), native.label());
        // A Python frame's name is never touched, however long (`<locals>` is no template).
        let qualified =
            "Trainer._inner_training_loop.<locals>.closure.<locals>.step_with_a_very_long_name";
        let python = frame(qualified, PYTHON_MODULE);
        assert_eq!(text_label(&python, Fold::Machinery), python.label());
    }

    #[test]
    fn tree_nodes_that_folding_brings_to_one_place_are_one() {
        use crate::analysis::groups::{StackGroup, tree};
        let aten = "/venv/torch/lib/libtorch_cpu.so";
        let alloc = native("alloc", "/work/app");
        let forward = python("Mlp.forward", "/work/model.py", 42);
        let group = |frames: Vec<SymFrame>, bytes: u64| StackGroup {
            frames: frames.into(),
            bytes,
            count: 1,
            processes: vec![0],
            thread: None,
        };
        // `forward` reaches `alloc` through two ATen paths, and a third time directly.
        let groups = [
            group(
                vec![alloc.clone(), native("at::relu", aten), forward.clone()],
                300,
            ),
            group(
                vec![alloc.clone(), native("at::mm", aten), forward.clone()],
                200,
            ),
            group(vec![alloc.clone(), forward.clone()], 50),
            group(vec![native("other", "/work/app"), forward.clone()], 400),
        ];
        let root = tree(&groups);
        let shown = |fold: Fold| -> Vec<(String, u64, u64)> {
            let forward = &ShownNode::root(&root).children(fold)[0];
            forward
                .children(fold)
                .iter()
                .map(|child| {
                    (
                        child.frame().map(SymFrame::label).unwrap_or_default(),
                        child.bytes,
                        child.count,
                    )
                })
                .collect()
        };
        assert_eq!(
            shown(Fold::Machinery),
            [("alloc".to_string(), 550, 3), ("other".to_string(), 400, 1)]
        );
        assert_eq!(
            shown(Fold::Nothing),
            [
                ("other".to_string(), 400, 1),
                ("at::relu".to_string(), 300, 1),
                ("at::mm".to_string(), 200, 1),
                ("alloc".to_string(), 50, 1),
            ]
        );
    }
}
