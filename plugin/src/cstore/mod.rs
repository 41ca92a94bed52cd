//! Custom storage (CUDA 13.4, `docs/custom-storage.md`): each task's GPU memory copied by the
//! plugin's copier process straight between the GPU and one image file per task and GPU,
//! `cuda-cs-<pid>-<n>.img`, per GPU and per task in parallel, checksummed, uniform chunks
//! recorded instead of written.
//!
//! | Module | Role |
//! |---|---|
//! | [`format`](mod@format) | The file format: frames, their encoding, the strict reading rules. |
//! | [`pipeline`] | Moving one GPU's bytes between the device and a file, the copies overlapped with the file I/O, through the [`pipeline::DeviceCopy`] seam. |
//! | [`copier`] | The copier process's side: the driver calls, one thread per GPU, the files of one task. |
//! | [`client`] | CRIU's side: the copier, the jobs, what each task's operation left for its task image. |

pub mod client;
pub mod copier;
pub mod format;
pub mod pipeline;
