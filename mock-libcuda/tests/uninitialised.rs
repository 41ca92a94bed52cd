//! What a caller that never called `cuInit` may do. A file of its own, so that no other test
//! in the same process has initialised the driver first (`cuInit` is process-wide).

mod common;

use abi::{CUprocessState, CUresult};
use common::*;
use mock_libcuda::driver;

#[test]
fn restore_needs_cuinit_in_the_caller_but_lock_and_checkpoint_do_not() {
    let _s = serial();
    let mut w = TestWorld::new(&config(580, ""));
    let pid = w.spawn_app(&["--kib", "16"]);
    driver::lock(pid, 5000).unwrap();
    driver::checkpoint(pid).unwrap();
    assert_eq!(
        driver::restore(pid, &[]),
        Err(CUresult::ERROR_NOT_INITIALIZED)
    );
    assert_eq!(
        driver::get_state(pid),
        Ok(CUprocessState::CHECKPOINTED),
        "a refused restore changes nothing"
    );
    driver::init(0).unwrap();
    driver::restore(pid, &[]).unwrap();
    driver::unlock(pid).unwrap();
    assert!(w.verify(0, pid).starts_with("PASS"));
}
