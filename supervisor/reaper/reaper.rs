//! `openshell-sandbox-reaper`: what PID 1 of an isolated sandbox served by
//! a supervisor host becomes once the sandbox is set up. It reaps every
//! child and sleeps until the next `SIGCHLD`, and nothing else: no libc, no
//! heap, no data written, so a sandbox's PID 1 costs about its stack page
//! instead of a forked copy of the setup's memory.
//!
//! Not a cargo target: `build.rs` compiles this file alone with `rustc`
//! (static, no start files, `panic=abort`) and the supervisor embeds the
//! result (see `isolation::init`). x86-64 Linux only; elsewhere PID 1 reaps
//! in the init's own code.
#![no_std]
#![no_main]

use core::arch::{asm, global_asm};

const SYS_RT_SIGPROCMASK: usize = 14;
const SYS_EXIT: usize = 60;
const SYS_WAIT4: usize = 61;
const SYS_RT_SIGTIMEDWAIT: usize = 128;
const SYS_PRCTL: usize = 157;
const SIG_BLOCK: usize = 0;
const SIGCHLD: usize = 17;
const WNOHANG: usize = 1;
const PR_SET_DUMPABLE: usize = 4;
/// The kernel's signal set size, in bytes.
const SIGSET_SIZE: usize = 8;

/// A raw Linux system call with up to four arguments.
///
/// # Safety
/// The arguments must be valid for system call `n`.
unsafe fn syscall(n: usize, a: usize, b: usize, c: usize, d: usize) -> isize {
    let ret: isize;
    // SAFETY: the x86-64 Linux system call convention; the kernel clobbers
    // only rcx and r11, and the caller vouches for the arguments.
    unsafe {
        asm!(
            "syscall",
            inlateout("rax") n as isize => ret,
            in("rdi") a,
            in("rsi") b,
            in("rdx") c,
            in("r10") d,
            lateout("rcx") _,
            lateout("r11") _,
            options(nostack),
        );
    }
    ret
}

// The entry point: the kernel starts us with the stack pointer on argc;
// align it for a call and never return.
global_asm!(
    ".globl _start",
    "_start:",
    "xor ebp, ebp",
    "and rsp, -16",
    "call {reap}",
    "ud2",
    reap = sym reap,
);

extern "C" fn reap() -> ! {
    let chld: u64 = 1 << (SIGCHLD - 1);
    let chld_ptr = &chld as *const u64 as usize;
    // SAFETY: every pointer passed points at a live local of the right size.
    unsafe {
        // exec made us dumpable again: no ptrace, no /proc/1/mem.
        syscall(SYS_PRCTL, PR_SET_DUMPABLE, 0, 0, 0);
        // Blocked, a SIGCHLD sent between the reaping and the wait stays
        // pending instead of being lost.
        if syscall(SYS_RT_SIGPROCMASK, SIG_BLOCK, chld_ptr, 0, SIGSET_SIZE) != 0 {
            syscall(SYS_EXIT, 1, 0, 0, 0);
        }
        loop {
            let mut status: i32 = 0;
            let status_ptr = &mut status as *mut i32 as usize;
            while syscall(SYS_WAIT4, usize::MAX, status_ptr, WNOHANG, 0) > 0 {}
            syscall(SYS_RT_SIGTIMEDWAIT, chld_ptr, 0, 0, SIGSET_SIZE);
        }
    }
}

#[panic_handler]
fn panic(_: &core::panic::PanicInfo) -> ! {
    // SAFETY: exit takes a plain integer and does not return.
    unsafe {
        syscall(SYS_EXIT, 127, 0, 0, 0);
    }
    loop {}
}
