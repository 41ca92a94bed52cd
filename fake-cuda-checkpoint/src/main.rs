//! `cuda-checkpoint`: a stand-in for NVIDIA's utility, built the way the real one is.
//!
//! The shipped binary is a trampoline; the whole command line (parsing, help, messages, exit
//! statuses) lives in the driver. This one does the same, so it runs against the mock
//! `libcuda.so.1` and against a real driver alike:
//!
//! 1. load `libcuda.so.1` through the normal search path (`LD_LIBRARY_PATH` applies); if it
//!    cannot be loaded, print the dynamic loader's message
//!    (`<argv0>: error while loading shared libraries: <dlerror>`) and exit 127, as a binary
//!    with `NEEDED libcuda.so.1` does when the loader fails;
//! 2. `cuDriverGetVersion`; a failure or a version below 12040 (CUDA 12.4, r550) prints
//!    `Insufficient driver` on stderr and exits 255;
//! 3. `cuGetExportTable` with the checkpoint CLI table id; a failure, or a table whose first
//!    8-byte word (its size) is below 64, takes the same `Insufficient driver` path;
//! 4. call the entry at byte offset 0x38 of the table as `int (int argc, char **argv)` with
//!    this process's arguments and exit with its result (the kernel keeps the low 8 bits).
//!
//! Where the real binary would crash, this one takes the `Insufficient driver` path: a
//! successful `cuGetExportTable` that yields a NULL table or a NULL entry. A driver that lacks
//! `cuDriverGetVersion` or `cuGetExportTable` gets the loader's lazy-binding message
//! (`<argv0>: symbol lookup error: <argv0>: undefined symbol: <name>`) and exit 127.
//! The library is never unloaded: the process exits with it still mapped.

use std::ffi::{c_int, OsString};
use std::io::Write;
use std::os::unix::ffi::OsStrExt;

use abi::cuda::CHECKPOINT_CLI_MIN_DRIVER_VERSION;
use abi::CUresult;

/// Exit status of a dynamic-loader failure.
const EXIT_LOADER: i32 = 127;
/// Exit status of `Insufficient driver` (`main` returns -1).
const EXIT_INSUFFICIENT: i32 = 255;

/// A driver entry point the loaded library does not export.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct MissingSymbol(&'static str);

/// What `cuGetExportTable` yielded for the checkpoint CLI table.
#[derive(Debug, Clone, Copy)]
enum Table {
    /// The call failed, the table is too small, or it has no entry.
    Unusable,
    /// The command-line entry point.
    Entry(ffi::CliEntry),
}

/// The two driver calls the trampoline makes, so the flow can be tested without a driver.
trait Driver {
    /// `cuDriverGetVersion`.
    fn driver_version(&self) -> Result<Result<c_int, CUresult>, MissingSymbol>;
    /// `cuGetExportTable` for the checkpoint CLI id, checked as the utility checks it.
    fn cli_table(&self) -> Result<Table, MissingSymbol>;
}

impl Driver for ffi::Libcuda {
    fn driver_version(&self) -> Result<Result<c_int, CUresult>, MissingSymbol> {
        ffi::Libcuda::driver_version(self)
    }
    fn cli_table(&self) -> Result<Table, MissingSymbol> {
        ffi::Libcuda::cli_table(self)
    }
}

/// `argv` as C wants it: each argument NUL-terminated, in its own writable buffer.
fn c_arguments(args: &[OsString]) -> Vec<Vec<u8>> {
    args.iter()
        .map(|a| {
            // Arguments from the kernel are C strings: they hold no NUL of their own.
            let mut v = a.as_bytes().to_vec();
            v.push(0);
            v
        })
        .collect()
}

/// Steps 2-4 of the module documentation; returns the exit status (0..=255).
fn trampoline(program: &str, driver: &dyn Driver, args: &[OsString], err: &mut dyn Write) -> i32 {
    let missing = |err: &mut dyn Write, MissingSymbol(name)| {
        let _ = writeln!(
            err,
            "{program}: symbol lookup error: {program}: undefined symbol: {name}"
        );
        EXIT_LOADER
    };
    let insufficient = |err: &mut dyn Write| {
        let _ = writeln!(err, "Insufficient driver");
        EXIT_INSUFFICIENT
    };
    match driver.driver_version() {
        Err(m) => return missing(err, m),
        Ok(Ok(v)) if v >= CHECKPOINT_CLI_MIN_DRIVER_VERSION => {}
        Ok(_) => return insufficient(err),
    }
    let entry = match driver.cli_table() {
        Err(m) => return missing(err, m),
        Ok(Table::Unusable) => return insufficient(err),
        Ok(Table::Entry(e)) => e,
    };
    let mut buffers = c_arguments(args);
    let _ = err.flush();
    ffi::call_cli(entry, &mut buffers) & 0xff
}

fn main() {
    let args: Vec<OsString> = std::env::args_os().collect();
    let program = args.first().map_or_else(
        || "cuda-checkpoint".to_owned(),
        |a| a.to_string_lossy().into_owned(),
    );
    let mut stderr = std::io::stderr();
    let status = match ffi::Libcuda::open() {
        Ok(lib) => trampoline(&program, &lib, &args, &mut stderr),
        Err(dlerror) => {
            let _ = writeln!(
                stderr,
                "{program}: error while loading shared libraries: {dlerror}"
            );
            EXIT_LOADER
        }
    };
    std::process::exit(status);
}

/// Every `unsafe` of the program: loading the driver, calling into it, reading its table.
mod ffi {
    use std::ffi::{c_char, c_int, c_void};
    use std::mem::ManuallyDrop;

    use abi::cuda::{
        CheckpointCliExportTable, CHECKPOINT_CLI_EXPORT_TABLE_ID,
        CHECKPOINT_CLI_EXPORT_TABLE_MIN_SIZE,
    };
    use abi::{CUresult, CUuuid};
    use libloading::Library;

    use super::{MissingSymbol, Table};

    /// The driver's command-line entry point: `int (int argc, char **argv)`.
    pub type CliEntry = unsafe extern "C" fn(argc: c_int, argv: *mut *mut c_char) -> c_int;
    type DriverGetVersion = unsafe extern "C" fn(version: *mut c_int) -> CUresult;
    type GetExportTable =
        unsafe extern "C" fn(table: *mut *const c_void, id: *const CUuuid) -> CUresult;

    /// The loaded `libcuda.so.1`, never unloaded (a driver may leave threads and TLS
    /// destructors behind; the process exits with it mapped, as the real utility does).
    pub struct Libcuda {
        lib: ManuallyDrop<Library>,
    }

    impl std::fmt::Debug for Libcuda {
        fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            f.write_str("Libcuda")
        }
    }

    impl Libcuda {
        /// `dlopen("libcuda.so.1")` through the normal search path; the error is dlerror's text.
        pub fn open() -> Result<Libcuda, String> {
            // SAFETY: loading runs the library's initialisers. libcuda.so.1 is the driver the
            // utility exists to talk to; running its constructors is what linking against it
            // (as NVIDIA's binary does) would do too.
            let lib = unsafe { Library::new("libcuda.so.1") }.map_err(|e| e.to_string())?;
            Ok(Libcuda {
                lib: ManuallyDrop::new(lib),
            })
        }

        fn symbol<T: Copy>(&self, name: &'static str) -> Result<T, MissingSymbol> {
            let mut cname = name.as_bytes().to_vec();
            cname.push(0);
            // SAFETY: every caller names `T` as the C signature the CUDA driver API documents
            // for `name` (see the type aliases above); the library stays loaded for the life of
            // the process, so the copied function pointer never dangles.
            unsafe { self.lib.get::<T>(&cname) }
                .map(|s| *s)
                .map_err(|_| MissingSymbol(name))
        }

        /// `cuDriverGetVersion`.
        pub fn driver_version(&self) -> Result<Result<c_int, CUresult>, MissingSymbol> {
            let f: DriverGetVersion = self.symbol("cuDriverGetVersion")?;
            let mut v: c_int = 0;
            // SAFETY: `f` is cuDriverGetVersion; it writes one int through a valid pointer.
            let r = unsafe { f(&mut v) };
            Ok(if r.is_success() { Ok(v) } else { Err(r) })
        }

        /// `cuGetExportTable` for the checkpoint CLI id, then the utility's size check.
        pub fn cli_table(&self) -> Result<Table, MissingSymbol> {
            let f: GetExportTable = self.symbol("cuGetExportTable")?;
            let mut table: *const c_void = std::ptr::null();
            // SAFETY: `f` is cuGetExportTable; it writes one pointer through a valid
            // out-pointer and reads the 16-byte id, which is a static.
            let r = unsafe { f(&mut table, &CHECKPOINT_CLI_EXPORT_TABLE_ID) };
            if !r.is_success() || table.is_null() {
                return Ok(Table::Unusable);
            }
            // SAFETY: a driver that serves this id returns a table starting with its size in
            // bytes as a u64; read_unaligned makes no alignment assumption.
            let size = unsafe { table.cast::<u64>().read_unaligned() };
            if size < CHECKPOINT_CLI_EXPORT_TABLE_MIN_SIZE {
                return Ok(Table::Unusable);
            }
            // SAFETY: the table is at least 64 bytes long (checked above), which covers
            // `CheckpointCliExportTable` (64 bytes, layout asserted in `abi`); the entry is an
            // optional function pointer, so NULL reads as `None`.
            let t = unsafe { table.cast::<CheckpointCliExportTable>().read_unaligned() };
            Ok(t.run.map_or(Table::Unusable, Table::Entry))
        }
    }

    /// Calls the driver's command line with `args` (each NUL-terminated) as `argv`; returns
    /// what it returns.
    pub fn call_cli(entry: CliEntry, args: &mut [Vec<u8>]) -> c_int {
        let mut argv: Vec<*mut c_char> = args
            .iter_mut()
            .map(|a| a.as_mut_ptr().cast::<c_char>())
            .chain(std::iter::once(std::ptr::null_mut()))
            .collect();
        let argc = c_int::try_from(args.len()).unwrap_or(c_int::MAX);
        // SAFETY: `argv` holds `argc` pointers to writable NUL-terminated buffers that outlive
        // the call, followed by NULL, as C's `main` receives them; `entry` came from the
        // driver's table (or a test) with the signature `int (int, char **)`.
        unsafe { entry(argc, argv.as_mut_ptr()) }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::cell::Cell;
    use std::ffi::c_char;

    #[derive(Debug)]
    struct FakeDriver {
        version: Result<Result<c_int, CUresult>, MissingSymbol>,
        table: Result<Table, MissingSymbol>,
        table_asked: Cell<bool>,
    }

    impl Driver for FakeDriver {
        fn driver_version(&self) -> Result<Result<c_int, CUresult>, MissingSymbol> {
            self.version
        }
        fn cli_table(&self) -> Result<Table, MissingSymbol> {
            self.table_asked.set(true);
            self.table
        }
    }

    /// Returns 256 + argc, so the caller must keep only the low 8 bits.
    unsafe extern "C" fn echo_argc(argc: c_int, _argv: *mut *mut c_char) -> c_int {
        256 + argc
    }

    /// Returns -1, like a `main` that returns -1.
    unsafe extern "C" fn minus_one(_argc: c_int, _argv: *mut *mut c_char) -> c_int {
        -1
    }

    fn fake(version: Result<c_int, CUresult>, table: Table) -> FakeDriver {
        FakeDriver {
            version: Ok(version),
            table: Ok(table),
            table_asked: Cell::new(false),
        }
    }

    fn go(d: &FakeDriver, args: &[&str]) -> (i32, String) {
        let args: Vec<OsString> = args.iter().map(OsString::from).collect();
        let mut err = Vec::new();
        let code = trampoline("cuda-checkpoint", d, &args, &mut err);
        (code, String::from_utf8_lossy(&err).into_owned())
    }

    #[test]
    fn old_or_failing_drivers_are_insufficient() {
        for v in [
            Ok(12039),
            Ok(0),
            Ok(-1),
            Err(CUresult::ERROR_NOT_INITIALIZED),
        ] {
            let d = fake(v, Table::Entry(echo_argc));
            assert_eq!(go(&d, &["x"]), (255, "Insufficient driver\n".to_owned()));
            assert!(
                !d.table_asked.get(),
                "the table is only asked of a new enough driver"
            );
        }
        let d = fake(Ok(13000), Table::Unusable);
        assert_eq!(go(&d, &["x"]), (255, "Insufficient driver\n".to_owned()));
        assert!(d.table_asked.get());
    }

    #[test]
    fn the_entry_gets_argv_and_its_result_is_the_exit_status() {
        let d = fake(
            Ok(CHECKPOINT_CLI_MIN_DRIVER_VERSION),
            Table::Entry(echo_argc),
        );
        assert_eq!(
            go(&d, &["cuda-checkpoint", "--get-state", "--pid", "1"]),
            (4, String::new())
        );
        let d = fake(Ok(13000), Table::Entry(minus_one));
        assert_eq!(go(&d, &["cuda-checkpoint"]), (255, String::new()));
    }

    #[test]
    fn missing_entry_points_get_the_loader_message() {
        let mut d = fake(Ok(13000), Table::Entry(echo_argc));
        d.version = Err(MissingSymbol("cuDriverGetVersion"));
        assert_eq!(
            go(&d, &["x"]),
            (
                127,
                "cuda-checkpoint: symbol lookup error: cuda-checkpoint: undefined symbol: cuDriverGetVersion\n"
                    .to_owned()
            )
        );
        let mut d = fake(Ok(13000), Table::Entry(echo_argc));
        d.table = Err(MissingSymbol("cuGetExportTable"));
        assert_eq!(go(&d, &["x"]).0, 127);
    }

    #[test]
    fn arguments_become_nul_terminated_buffers() {
        let args = [
            OsString::from("cuda-checkpoint"),
            OsString::from(""),
            OsString::from("é"),
        ];
        assert_eq!(
            c_arguments(&args),
            [
                b"cuda-checkpoint\0".to_vec(),
                b"\0".to_vec(),
                "é\0".as_bytes().to_vec()
            ]
        );
    }
}
