//! The ids CRIU hands the hooks, shared by every layer (the bottom of the plugin's modules: it
//! uses none of them).

/// A process id as CRIU passes it to the hooks (`pid->real`).
pub type Pid = i32;
/// A thread id (the CUDA restore thread).
pub type Tid = i32;
