//! zdtm-cuda: runner for real CUDA workloads on GPU machines (built out in the zdtm issue).
