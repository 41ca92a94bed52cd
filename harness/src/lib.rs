//! The CRIU plugin-engine emulation and scenario runner (built out in the harness issue).
