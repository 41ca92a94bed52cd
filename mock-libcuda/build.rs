fn main() {
    // The library impersonates the driver: every consumer asks the dynamic loader for
    // `libcuda.so.1`, so that is the SONAME it must carry.
    println!("cargo:rustc-cdylib-link-arg=-Wl,-soname,libcuda.so.1");
}
