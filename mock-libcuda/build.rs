fn main() {
    // The library impersonates the driver: every consumer asks the dynamic loader for
    // `libcuda.so.1`, so that is the SONAME it must carry.
    println!("cargo:rustc-cdylib-link-arg=-Wl,-soname,libcuda.so.1");
    // Bind the library's references to its own symbols at link time: a world hides symbols by
    // renaming them in the dynamic symbol table, which must not break the library itself.
    println!("cargo:rustc-cdylib-link-arg=-Wl,-Bsymbolic");
}
