fn main() {
    // Every NVML consumer asks the dynamic loader for `libnvidia-ml.so.1`.
    println!("cargo:rustc-cdylib-link-arg=-Wl,-soname,libnvidia-ml.so.1");
    // Bind the library's references to its own symbols at link time: a world renames the mock
    // driver's symbols (linked in with the world code) out of this library's dynamic table.
    println!("cargo:rustc-cdylib-link-arg=-Wl,-Bsymbolic");
}
