//! Custom storage (CUDA 13.4): each task's GPU memory moved straight between the GPU and files
//! in the image directory, per GPU and per task in parallel, checksummed, uniform chunks
//! recorded instead of written (see `docs/custom-storage.md`).
//!
//! * [`format`]: the files, `cuda-cs-<pid>-<n>.img`;
//! * [`pipeline`]: one GPU's bytes between the device and its file, double-buffered;
//! * [`copier`]: the copier process's side (the driver calls, one thread per GPU);
//! * [`client`]: CRIU's side (the copier, the jobs, what each task's operation left).

pub mod client;
pub mod copier;
pub mod format;
pub mod pipeline;
