//! `cuda_plugin.so`: the CRIU CUDA plugin (built out in the plugin issue).
