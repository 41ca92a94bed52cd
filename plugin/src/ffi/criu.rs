//! CRIU's services and data, found with `dlsym(RTLD_DEFAULT, …)` at run time.
//!
//! CRIU is linked with `-rdynamic`, so its globals are visible to plugins. They are never
//! imported as plain externs: a Rust cdylib binds every import at load (`BIND_NOW`), so one
//! symbol the host lacks (`has_inventory_plugin` on 4.1, for example) would make `dlopen` fail and
//! abort the whole dump. Every look-up here may come back empty; callers degrade and log why.
//!
//! | Symbol | Signature / layout | Since |
//! |---|---|---|
//! | `print_on_level` | `void (unsigned level, const char *fmt, ...)` (in [`super::log`]) | always |
//! | `add_inventory_plugin` | `int (const char *name)` | 4.0 |
//! | `check_and_remove_inventory_plugin` | `bool (const char *name, size_t n)` (prefix match on `n` bytes); `bool (const char *name)` (exact) on hosts with `has_inventory_plugin` | 4.0 / proposed |
//! | `has_inventory_plugin` | `bool (const char *name)` | proposed |
//! | `criu_get_image_dir` | `int (void)` | 4.0 |
//! | `criu_plugin_get_options` | `int (int *argc, char ***argv)` | upstream (#3138) |
//! | `img_streamer_open` | `int (char *name, int flags)` | 4.0 |
//! | `set_compel_interrupt_only_mode` | `void (void)` | 4.0 |
//! | `opts` | `struct cr_options`: `final_state` (int) at +0, `timeout` (unsigned) at +0x160 | stable offsets 4.1 … dev |
//! | `fi_strategy` | `int` | 4.0 |
//! | `cr_plugin_ctl` | list heads; ELF size = 16 × (hook count + 1) | 4.0 |

use crate::PLUGIN_NAME;
use std::ffi::{c_char, c_int, c_void, CStr, CString};
use std::fs::File;
use std::io::{Read, Write};
use std::os::fd::FromRawFd;
use std::ptr::NonNull;
use std::time::Duration;

type AddInventoryFn = unsafe extern "C" fn(*const c_char) -> c_int;
type CheckRemovePrefixFn = unsafe extern "C" fn(*const c_char, usize) -> bool;
type CheckRemoveExactFn = unsafe extern "C" fn(*const c_char) -> bool;
type HasInventoryFn = unsafe extern "C" fn(*const c_char) -> bool;
type GetImageDirFn = unsafe extern "C" fn() -> c_int;
type GetOptionsFn = unsafe extern "C" fn(*mut c_int, *mut *mut *mut c_char) -> c_int;
type VoidFn = unsafe extern "C" fn();
type StreamerOpenFn = unsafe extern "C" fn(*mut c_char, c_int) -> c_int;
type AlarmTimeoutedFn = unsafe extern "C" fn() -> bool;

use abi::criu::opts::{FINAL_STATE as OPTS_FINAL_STATE, TIMEOUT as OPTS_TIMEOUT};
use abi::criu::streamer::{O_DUMP as STREAMER_O_DUMP, O_RSTR as STREAMER_O_RSTR};
use abi::criu::RTLD_DL_SYMENT;

/// What the inventory says about `cuda_plugin` at restore.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum InventoryAnswer {
    NotListed,
    /// Listed; `consumed` when the only available query also removed the entry (CRIU 4.1's
    /// destructive `check_and_remove_inventory_plugin`).
    Listed {
        consumed: bool,
    },
    /// The host has no inventory service; assume listed.
    Unknown(String),
}

/// A failed host service.
#[derive(Debug, thiserror::Error)]
pub enum HostError {
    #[error("CRIU does not export {0}")]
    Missing(&'static str),
    #[error("{service} failed")]
    Failed { service: &'static str },
    #[error("{service}(\"cuda_plugin\") found no entry")]
    NoEntry { service: &'static str },
    #[error("{what} {name}: {source}")]
    Io {
        what: &'static str,
        name: String,
        #[source]
        source: std::io::Error,
    },
    #[error("image {name} is {kind}, not a regular file")]
    NotRegular { name: String, kind: &'static str },
    #[error("image {name} is larger than the {limit} bytes such an image can hold")]
    TooLarge { name: String, limit: usize },
}

/// CRIU's freeze alarm (`alarm(--timeout)` around seizing the tree and PAUSE_DEVICES; when it
/// fires CRIU interrupts what it waits for, and five seconds later aborts without a rollback).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FreezeAlarm {
    /// The host exports no `alarm_timeouted`: nothing is known.
    Unknown,
    /// No alarm is pending.
    Disarmed,
    /// It fires in `left`.
    Armed { left: std::time::Duration },
    /// It has fired (`alarm_timeouted()`).
    Expired,
}

/// The address of CRIU's global `name`, or `None`.
fn lookup(name: &CStr) -> Option<NonNull<c_void>> {
    // SAFETY: dlsym with RTLD_DEFAULT and a NUL-terminated name only reads loader tables.
    NonNull::new(unsafe { libc::dlsym(libc::RTLD_DEFAULT, name.as_ptr()) })
}

/// Looks up a CRIU function and gives it its C type.
macro_rules! criu_fn {
    ($name:literal, $ty:ty) => {
        lookup($name).map(|p| {
            // SAFETY: the symbol is CRIU's exported function of that name, whose C signature is
            // the one in the table of the module docs and in `$ty`; data and function pointers
            // have the same size and representation on the supported (LP64 Linux) targets.
            unsafe { std::mem::transmute::<*mut c_void, $ty>(p.as_ptr()) }
        })
    };
}

/// The ELF symbol size of the object at `addr` (`dladdr1` with `RTLD_DL_SYMENT`).
fn symbol_size(addr: NonNull<c_void>) -> Option<usize> {
    let mut info = std::mem::MaybeUninit::<libc::Dl_info>::zeroed();
    let mut sym: *mut libc::Elf64_Sym = std::ptr::null_mut();
    // SAFETY: `info` and `sym` are valid out-pointers of the types dladdr1 writes for
    // RTLD_DL_SYMENT (a Dl_info and a `const ElfW(Sym) *`).
    let found = unsafe {
        libc::dladdr1(
            addr.as_ptr(),
            info.as_mut_ptr(),
            (&raw mut sym).cast::<*mut c_void>(),
            RTLD_DL_SYMENT,
        )
    };
    if found == 0 || sym.is_null() {
        return None;
    }
    // SAFETY: dladdr1 succeeded and set `sym` to the loader's symbol table entry, which stays
    // valid while the object is loaded (CRIU's executable: forever).
    usize::try_from(unsafe { (*sym).st_size }).ok()
}

/// The ELF size of CRIU's `cr_plugin_ctl` (for [`crate::hooks::choose`]).
#[must_use]
pub fn plugin_ctl_size() -> Option<usize> {
    symbol_size(lookup(c"cr_plugin_ctl")?)
}

/// Reads a 32-bit value at `offset` in CRIU's data object `name`, after checking the object's
/// ELF size covers it.
fn read_u32(name: &CStr, offset: usize) -> Option<u32> {
    let base = lookup(name)?;
    let size = symbol_size(base)?;
    if size < offset + 4 {
        return None;
    }
    // SAFETY: the object is `size` bytes long (its ELF symbol size), so `offset..offset + 4` is
    // inside it; CRIU's globals are at least 4-byte aligned at these offsets (an int/unsigned
    // field), and read_unaligned makes no alignment assumption anyway. CRIU writes these fields
    // before plugins are initialised and not concurrently with the hooks.
    Some(unsafe {
        base.as_ptr()
            .cast::<u8>()
            .add(offset)
            .cast::<u32>()
            .read_unaligned()
    })
}

/// CRIU's `opts.final_state` (TASK_ALIVE = 1 with `--leave-running`).
#[must_use]
pub fn opts_final_state() -> Option<i32> {
    read_u32(c"opts", OPTS_FINAL_STATE).map(|v| v as i32)
}

/// CRIU's `opts.timeout` in seconds.
#[must_use]
pub fn opts_timeout() -> Option<u32> {
    read_u32(c"opts", OPTS_TIMEOUT)
}

/// CRIU's `fi_strategy` (fault injection number).
#[must_use]
pub fn fault_strategy() -> Option<i32> {
    read_u32(c"fi_strategy", 0).map(|v| v as i32)
}

/// `criu_plugin_get_options`: copies of the strings after `argv[0]`; `Ok(None)` when the host
/// lacks the service, `Err(code)` when it fails. CRIU's array is only read.
pub fn plugin_options() -> Result<Option<Vec<String>>, c_int> {
    let Some(get) = criu_fn!(c"criu_plugin_get_options", GetOptionsFn) else {
        return Ok(None);
    };
    let mut argc: c_int = 0;
    let mut argv: *mut *mut c_char = std::ptr::null_mut();
    // SAFETY: both out-pointers are valid; CRIU fills them with its own array, which it owns.
    let r = unsafe { get(&mut argc, &mut argv) };
    if r != 0 || argv.is_null() {
        return Err(r);
    }
    let argc = usize::try_from(argc).unwrap_or(0);
    let mut out = Vec::with_capacity(argc.saturating_sub(1));
    for i in 1..argc {
        // SAFETY: CRIU's contract: `argv` has `argc` entries followed by NULL, each a
        // NUL-terminated string or NULL; we read them and copy, never write.
        let p = unsafe { *argv.add(i) };
        if p.is_null() {
            break;
        }
        // SAFETY: as above, `p` is a valid NUL-terminated string owned by CRIU.
        out.push(unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned());
    }
    Ok(Some(out))
}

/// `set_compel_interrupt_only_mode()`: makes CRIU stop tasks with PTRACE_INTERRUPT instead of
/// the cgroup freezer, which would also freeze the restore threads. Returns false if absent.
pub fn set_interrupt_only_mode() -> bool {
    match criu_fn!(c"set_compel_interrupt_only_mode", VoidFn) {
        Some(f) => {
            // SAFETY: a CRIU function without arguments that sets a global flag.
            unsafe { f() };
            true
        }
        None => false,
    }
}

fn name_c() -> CString {
    CString::new(PLUGIN_NAME).unwrap_or_default()
}

/// `add_inventory_plugin("cuda_plugin")`: lists the plugin in the dump's inventory.
pub fn add_inventory_plugin() -> Result<(), HostError> {
    let add = criu_fn!(c"add_inventory_plugin", AddInventoryFn)
        .ok_or(HostError::Missing("add_inventory_plugin"))?;
    let name = name_c();
    // SAFETY: CRIU's `int (const char *)`; it copies the NUL-terminated name.
    if unsafe { add(name.as_ptr()) } == 0 {
        Ok(())
    } else {
        Err(HostError::Failed {
            service: "add_inventory_plugin",
        })
    }
}

/// Whether the image inventory lists `cuda_plugin`, matched exactly.
///
/// With `has_inventory_plugin` (the #3076 line) the query consumes nothing. Otherwise CRIU 4.1's
/// destructive two-argument `check_and_remove_inventory_plugin` is called with `strlen + 1`
/// bytes, so the comparison includes the terminating NUL and `cuda_plugin_v2` does not match.
#[must_use]
pub fn inventory_query() -> InventoryAnswer {
    let name = name_c();
    if let Some(has) = criu_fn!(c"has_inventory_plugin", HasInventoryFn) {
        // SAFETY: a CRIU query taking a NUL-terminated name; it only reads it.
        return if unsafe { has(name.as_ptr()) } {
            InventoryAnswer::Listed { consumed: false }
        } else {
            InventoryAnswer::NotListed
        };
    }
    match criu_fn!(c"check_and_remove_inventory_plugin", CheckRemovePrefixFn) {
        Some(check) => {
            let n = name.as_bytes_with_nul().len();
            // SAFETY: CRIU 4.x's `bool (const char *, size_t)`; it compares at most `n` bytes of
            // the NUL-terminated `name`, which has exactly `n` bytes including the NUL.
            if unsafe { check(name.as_ptr(), n) } {
                InventoryAnswer::Listed { consumed: true }
            } else {
                InventoryAnswer::NotListed
            }
        }
        None => InventoryAnswer::Unknown("CRIU exports no inventory query".into()),
    }
}

/// Consumes the inventory entry on hosts where [`inventory_query`] did not.
pub fn inventory_consume() -> Result<(), HostError> {
    if lookup(c"has_inventory_plugin").is_none() {
        return Err(HostError::Missing(
            "an exact-match check_and_remove_inventory_plugin",
        ));
    }
    let check = criu_fn!(c"check_and_remove_inventory_plugin", CheckRemoveExactFn)
        .ok_or(HostError::Missing("check_and_remove_inventory_plugin"))?;
    let name = name_c();
    // SAFETY: on hosts with has_inventory_plugin, check_and_remove_inventory_plugin is the
    // one-argument exact form `bool (const char *)`; `name` is NUL-terminated.
    if unsafe { check(name.as_ptr()) } {
        Ok(())
    } else {
        Err(HostError::NoEntry {
            service: "check_and_remove_inventory_plugin",
        })
    }
}

/// CRIU's image directory descriptor, when the host has one (for the helper process's log).
#[must_use]
pub fn image_dir_fd() -> Option<c_int> {
    image_dir().ok().filter(|fd| *fd >= 0)
}

/// The image directory descriptor (`criu_get_image_dir()`).
fn image_dir() -> Result<c_int, HostError> {
    let f = criu_fn!(c"criu_get_image_dir", GetImageDirFn)
        .ok_or(HostError::Missing("criu_get_image_dir"))?;
    // SAFETY: a CRIU getter without arguments returning a descriptor number.
    let fd = unsafe { f() };
    if fd < 0 {
        return Err(HostError::Failed {
            service: "criu_get_image_dir",
        });
    }
    Ok(fd)
}

/// Whether `name` exists in the directory `dir` (used to detect `--stream`).
fn exists_at(dir: c_int, name: &CStr) -> bool {
    // SAFETY: faccessat only reads the NUL-terminated path relative to a directory descriptor.
    unsafe { libc::faccessat(dir, name.as_ptr(), libc::F_OK, 0) == 0 }
}

/// Whether CRIU runs with its image streamer (`--stream`): its socket is in the image directory.
#[must_use]
pub fn streaming() -> bool {
    image_dir().is_ok_and(|dir| {
        exists_at(dir, c"streamer-capture.sock") || exists_at(dir, c"streamer-serve.sock")
    })
}

/// Opens the image file `name` for reading as a regular file, never through a symbolic link
/// (`None`: there is none). For the custom-storage files, which are read in place.
pub fn open_image_file(name: &str) -> Result<Option<File>, HostError> {
    let dir = image_dir()?;
    let cname = CString::new(name).map_err(|e| io_err("name", name, e.into()))?;
    let flags =
        libc::O_RDONLY | libc::O_CLOEXEC | libc::O_NONBLOCK | libc::O_NOFOLLOW | libc::O_NOCTTY;
    // SAFETY: openat with a directory descriptor and a NUL-terminated flat name.
    let fd = unsafe { libc::openat(dir, cname.as_ptr(), flags) };
    if fd < 0 {
        let e = std::io::Error::last_os_error();
        return match e.raw_os_error() {
            Some(libc::ENOENT) => Ok(None),
            Some(libc::ELOOP) => Err(HostError::NotRegular {
                name: name.to_owned(),
                kind: "a symbolic link",
            }),
            _ => Err(io_err("cannot open image", name, e)),
        };
    }
    let file = own(fd);
    let meta = file
        .metadata()
        .map_err(|e| io_err("cannot stat image", name, e))?;
    let kind = file_kind(&meta.file_type());
    if kind != "a regular file" {
        return Err(HostError::NotRegular {
            name: name.to_owned(),
            kind,
        });
    }
    Ok(Some(file))
}

/// Opens a streamed image through CRIU's image streamer.
fn streamer_open(name: &CString, flags: c_int) -> Result<c_int, HostError> {
    let open = criu_fn!(c"img_streamer_open", StreamerOpenFn)
        .ok_or(HostError::Missing("img_streamer_open"))?;
    let mut buf = name.as_bytes_with_nul().to_vec();
    // SAFETY: img_streamer_open takes a writable NUL-terminated name (it only reads it; the
    // copy makes the mutability moot) and a flag value it accepts (O_DUMP or O_RSTR).
    Ok(unsafe { open(buf.as_mut_ptr().cast::<c_char>(), flags) })
}

/// Takes ownership of a fresh descriptor.
fn own(fd: c_int) -> File {
    // SAFETY: `fd` was just returned by openat/img_streamer_open, is valid, and nothing else
    // owns it.
    unsafe { File::from_raw_fd(fd) }
}

fn io_err(what: &'static str, name: &str, source: std::io::Error) -> HostError {
    HostError::Io {
        what,
        name: name.to_owned(),
        source,
    }
}

/// Writes the image file `name` in CRIU's image directory (or to the streamer under `--stream`).
pub fn write_image(name: &str, data: &[u8]) -> Result<(), HostError> {
    let dir = image_dir()?;
    let cname = CString::new(name).map_err(|e| io_err("name", name, e.into()))?;
    let fd = if exists_at(dir, c"streamer-capture.sock") {
        streamer_open(&cname, STREAMER_O_DUMP)?
    } else {
        // SAFETY: openat with a directory descriptor, a NUL-terminated flat name, and a mode.
        unsafe {
            libc::openat(
                dir,
                cname.as_ptr(),
                libc::O_WRONLY | libc::O_CREAT | libc::O_TRUNC | libc::O_CLOEXEC,
                0o600 as libc::c_uint,
            )
        }
    };
    if fd < 0 {
        let e = if fd == -1 {
            std::io::Error::last_os_error()
        } else {
            std::io::Error::from_raw_os_error(-fd)
        };
        return Err(io_err("cannot create image", name, e));
    }
    own(fd)
        .write_all(data)
        .map_err(|e| io_err("cannot write image", name, e))
}

/// Reads the image file `name`, at most `limit` bytes; `None` when it does not exist.
///
/// Images are CRIU's regular files (or, with `--stream`, the streamer's pipe): anything else in
/// their place (a FIFO that would block CRIU, `/dev/zero` that would be read until memory runs
/// out, a symbolic link, a directory) is refused without reading, and so is a file longer than
/// `limit`.
pub fn read_image(name: &str, limit: usize) -> Result<Option<Vec<u8>>, HostError> {
    let dir = image_dir()?;
    let cname = CString::new(name).map_err(|e| io_err("name", name, e.into()))?;
    let file = if exists_at(dir, c"streamer-serve.sock") {
        let fd = streamer_open(&cname, STREAMER_O_RSTR)?;
        if fd == -libc::ENOENT {
            return Ok(None);
        }
        if fd < 0 {
            return Err(io_err(
                "cannot open image",
                name,
                std::io::Error::from_raw_os_error(-fd),
            ));
        }
        own(fd)
    } else {
        let flags =
            libc::O_RDONLY | libc::O_CLOEXEC | libc::O_NONBLOCK | libc::O_NOFOLLOW | libc::O_NOCTTY;
        // SAFETY: openat with a directory descriptor and a NUL-terminated flat name.
        let fd = unsafe { libc::openat(dir, cname.as_ptr(), flags) };
        if fd < 0 {
            let e = std::io::Error::last_os_error();
            return match e.raw_os_error() {
                Some(libc::ENOENT) => Ok(None),
                Some(libc::ELOOP) => Err(HostError::NotRegular {
                    name: name.to_owned(),
                    kind: "a symbolic link",
                }),
                _ => Err(io_err("cannot open image", name, e)),
            };
        }
        let file = own(fd);
        let meta = file
            .metadata()
            .map_err(|e| io_err("cannot stat image", name, e))?;
        let kind = file_kind(&meta.file_type());
        if kind != "a regular file" {
            return Err(HostError::NotRegular {
                name: name.to_owned(),
                kind,
            });
        }
        file
    };
    let mut buf = Vec::new();
    file.take(u64::try_from(limit).unwrap_or(u64::MAX).saturating_add(1))
        .read_to_end(&mut buf)
        .map_err(|e| io_err("cannot read image", name, e))?;
    if buf.len() > limit {
        return Err(HostError::TooLarge {
            name: name.to_owned(),
            limit,
        });
    }
    Ok(Some(buf))
}

fn file_kind(t: &std::fs::FileType) -> &'static str {
    use std::os::unix::fs::FileTypeExt;
    if t.is_file() {
        "a regular file"
    } else if t.is_dir() {
        "a directory"
    } else if t.is_fifo() {
        "a FIFO"
    } else if t.is_char_device() {
        "a character device"
    } else if t.is_block_device() {
        "a block device"
    } else if t.is_socket() {
        "a socket"
    } else {
        "a special file"
    }
}

/// CRIU's freeze alarm: `alarm_timeouted()` says whether it fired; the time left comes from the
/// process's real-time interval timer, which `alarm(2)` arms (`getitimer(ITIMER_REAL)` reads it
/// without changing it).
#[must_use]
pub fn freeze_alarm() -> FreezeAlarm {
    let Some(fired) = criu_fn!(c"alarm_timeouted", AlarmTimeoutedFn) else {
        return FreezeAlarm::Unknown;
    };
    // SAFETY: CRIU's `bool alarm_timeouted(void)` reads a static counter.
    if unsafe { fired() } {
        return FreezeAlarm::Expired;
    }
    let mut t = std::mem::MaybeUninit::<libc::itimerval>::zeroed();
    // SAFETY: getitimer writes one itimerval into `t`, which is valid and writable.
    if unsafe { libc::getitimer(libc::ITIMER_REAL, t.as_mut_ptr()) } != 0 {
        return FreezeAlarm::Unknown;
    }
    // SAFETY: getitimer succeeded, so it initialised `t`.
    let v = unsafe { t.assume_init() }.it_value;
    let left = Duration::from_secs(u64::try_from(v.tv_sec).unwrap_or(0))
        + Duration::from_micros(u64::try_from(v.tv_usec).unwrap_or(0));
    if left.is_zero() {
        FreezeAlarm::Disarmed
    } else {
        FreezeAlarm::Armed { left }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn outside_criu_every_service_is_absent_and_degrades() {
        assert_eq!(plugin_ctl_size(), None);
        assert_eq!(opts_timeout(), None);
        assert_eq!(opts_final_state(), None);
        assert_eq!(fault_strategy(), None);
        assert_eq!(plugin_options(), Ok(None));
        assert!(!set_interrupt_only_mode());
        assert!(matches!(inventory_query(), InventoryAnswer::Unknown(_)));
        assert!(inventory_consume().is_err());
        assert!(matches!(
            add_inventory_plugin(),
            Err(HostError::Missing("add_inventory_plugin"))
        ));
        assert!(matches!(
            read_image("x", 10),
            Err(HostError::Missing("criu_get_image_dir"))
        ));
        assert_eq!(freeze_alarm(), FreezeAlarm::Unknown, "no alarm_timeouted");
        crate::ffi::log::log(
            abi::criu::log_level::INFO,
            "logging falls back to stderr with %s %n intact",
        );
    }

    #[test]
    fn symbol_size_reads_elf_sizes() {
        // A libc data object with a known size.
        let p = lookup(c"environ").expect("environ is exported");
        assert_eq!(symbol_size(p), Some(std::mem::size_of::<*mut c_void>()));
    }
}
