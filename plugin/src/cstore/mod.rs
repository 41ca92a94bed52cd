//! Custom storage (docs/custom-storage.md): a task's GPU memory copied by the plugin's copier
//! straight between the GPU and one image file per task and GPU, `cuda-cs-<pid>-<n>.img`.
//!
//! | Module | Role |
//! |---|---|
//! | [`format`](mod@format) | The file format: frames, their encoding, the strict reading rules. |
//! | [`pipeline`] | Moving one GPU's bytes between the device and a file, double-buffered, through the [`pipeline::DeviceCopy`] seam. |

pub mod format;
pub mod pipeline;
