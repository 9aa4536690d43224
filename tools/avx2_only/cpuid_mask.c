/* Hide AVX-512, AVX-VNNI and AMX from every `cpuid` a process runs: an LD_PRELOAD shim for timing
 * medrobust as it runs on a CPU with AVX2 only (issue 47), on a CPU that has more.
 *
 * How: the constructor turns on Linux's CPUID faulting for the process (arch_prctl(ARCH_SET_CPUID,
 * 0); needs the `cpuid_fault` CPU flag), so each `cpuid` raises SIGSEGV. The handler runs the real
 * instruction with faulting briefly off for its own thread, clears the feature bits listed in
 * mask_leaf(), writes EAX..EDX into the interrupted context and steps over the 2-byte instruction.
 * Every library that picks its kernels by `cpuid` at run time (PyTorch's ATen and oneDNN, MKL,
 * ONNX Runtime's MLAS, OpenVINO, NumPy, the JVM) then picks its AVX2 kernels. Code compiled for
 * AVX-512 without a run-time check still runs it, and glibc's own string functions are chosen by
 * the loader before this constructor (tools/avx2_only/run.sh sets GLIBC_TUNABLES for those).
 *
 * Other SIGSEGV handlers (Python's faulthandler, the JVM's) keep working: sigaction() and signal()
 * for SIGSEGV are interposed, the program's handler is stored, and every fault that is not a
 * `cpuid` is passed to it (or to the default action). sigprocmask() and pthread_sigmask() never
 * block SIGSEGV (a blocked SIGSEGV from `cpuid` would kill the process); the program's own view of
 * its mask is not kept. Not interposed: handlers installed by raw rt_sigaction system calls (the Go
 * runtime) or glibc's internal sysv_signal/sigset; none of this project's libraries does that.
 *
 * The handler runs on the interrupted thread's own stack, never on an alternate signal stack: with
 * SA_ONSTACK, a cpuid in a library constructor after OpenVINO and ONNX Runtime had run in the same
 * process killed it (the frame did not fit faulthandler's alternate stack). A cpuid never runs on an
 * overflowed stack, so its emulation needs none; a program's own handler for a stack overflow is
 * the one case this changes.
 *
 * The setting is per thread, inherited by new threads and fork(); execve() clears it and the
 * constructor of the re-loaded shim sets it again (LD_PRELOAD is inherited). Set
 * CPUID_MASK_REPORT=1 to print, at exit, how many `cpuid` instructions were emulated.
 */
#define _GNU_SOURCE
#include <asm/prctl.h>
#include <cpuid.h>
#include <dlfcn.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <ucontext.h>
#include <unistd.h>

typedef int (*sigaction_fn)(int, const struct sigaction *, struct sigaction *);
typedef int (*sigmask_fn)(int, const sigset_t *, sigset_t *);

static sigaction_fn real_sigaction;
static struct sigaction program_handler; /* what the program asked for SIGSEGV; SIG_DFL at first */
static int active;
static volatile unsigned long emulated;

static long set_cpuid_enabled(int enabled) { return syscall(SYS_arch_prctl, ARCH_SET_CPUID, enabled); }

/* Leaf 7 sub-leaf 0, EBX: AVX512F 16, DQ 17, IFMA 21, PF 26, ER 27, CD 28, BW 30, VL 31. */
#define L7_EBX_CLEAR ((1u << 16) | (1u << 17) | (1u << 21) | (1u << 26) | (1u << 27) | (1u << 28) | (1u << 30) | (1u << 31))
/* ECX: AVX512_VBMI 1, AVX512_VBMI2 6, AVX512_VNNI 11, AVX512_BITALG 12, AVX512_VPOPCNTDQ 14. */
#define L7_ECX_CLEAR ((1u << 1) | (1u << 6) | (1u << 11) | (1u << 12) | (1u << 14))
/* EDX: AVX512_4VNNIW 2, AVX512_4FMAPS 3, AVX512_VP2INTERSECT 8, AMX_BF16 22, AVX512_FP16 23,
 * AMX_TILE 24, AMX_INT8 25. */
#define L7_EDX_CLEAR ((1u << 2) | (1u << 3) | (1u << 8) | (1u << 22) | (1u << 23) | (1u << 24) | (1u << 25))
/* Leaf 7 sub-leaf 1, EAX: AVX_VNNI 4, AVX512_BF16 5, AMX_FP16 21, AVX_IFMA 23; EDX: AVX_VNNI_INT8 4,
 * AVX_NE_CONVERT 5, AMX_COMPLEX 8, AVX_VNNI_INT16 10, AVX10 19. */
#define L7S1_EAX_CLEAR ((1u << 4) | (1u << 5) | (1u << 21) | (1u << 23))
#define L7S1_EDX_CLEAR ((1u << 4) | (1u << 5) | (1u << 8) | (1u << 10) | (1u << 19))

static void mask_leaf(uint32_t leaf, uint32_t sub, uint32_t r[4]) {
    if (leaf == 7 && sub == 0) {
        r[1] &= ~L7_EBX_CLEAR;
        r[2] &= ~L7_ECX_CLEAR;
        r[3] &= ~L7_EDX_CLEAR;
    } else if (leaf == 7 && sub == 1) {
        r[0] &= ~L7S1_EAX_CLEAR;
        r[3] &= ~L7S1_EDX_CLEAR;
    } else if (leaf == 0xD && sub == 0) {
        /* XSAVE components: opmask 5, ZMM_Hi256 6, Hi16_ZMM 7, XTILECFG 17, XTILEDATA 18 */
        r[0] &= ~((1u << 5) | (1u << 6) | (1u << 7) | (1u << 17) | (1u << 18));
    } else if (leaf == 0x1D || leaf == 0x1E || leaf == 0x24) {
        r[0] = r[1] = r[2] = r[3] = 0; /* AMX tile and TMUL information, AVX10 */
    }
}

static void on_segv(int sig, siginfo_t *info, void *context) {
    ucontext_t *uc = (ucontext_t *)context;
    const unsigned char *ip = (const unsigned char *)uc->uc_mcontext.gregs[REG_RIP];
    if (info->si_code == SI_KERNEL && ip[0] == 0x0F && ip[1] == 0xA2) {
        uint32_t leaf = (uint32_t)uc->uc_mcontext.gregs[REG_RAX];
        uint32_t sub = (uint32_t)uc->uc_mcontext.gregs[REG_RCX];
        uint32_t r[4];
        sigset_t all, old;
        sigfillset(&all);
        syscall(SYS_rt_sigprocmask, SIG_BLOCK, &all, &old, _NSIG / 8); /* no handler sees the real cpuid */
        set_cpuid_enabled(1);
        __cpuid_count(leaf, sub, r[0], r[1], r[2], r[3]);
        set_cpuid_enabled(0);
        syscall(SYS_rt_sigprocmask, SIG_SETMASK, &old, NULL, _NSIG / 8);
        mask_leaf(leaf, sub, r);
        uc->uc_mcontext.gregs[REG_RAX] = r[0];
        uc->uc_mcontext.gregs[REG_RBX] = r[1];
        uc->uc_mcontext.gregs[REG_RCX] = r[2];
        uc->uc_mcontext.gregs[REG_RDX] = r[3];
        uc->uc_mcontext.gregs[REG_RIP] += 2;
        __atomic_add_fetch(&emulated, 1, __ATOMIC_RELAXED);
        return;
    }
    struct sigaction h = program_handler;
    if (h.sa_flags & SA_SIGINFO) {
        h.sa_sigaction(sig, info, context);
    } else if (h.sa_handler != SIG_DFL && h.sa_handler != SIG_IGN) {
        h.sa_handler(sig);
    } else if (h.sa_handler == SIG_IGN && info->si_code <= 0) {
        return; /* an ignored SIGSEGV sent by kill()/raise(): ignored, as without the shim */
    } else {
        /* no handler: the default action. A fault re-executes its instruction and faults again; a
         * signal sent by kill()/raise() is raised again. Either way the process ends as it would. */
        struct sigaction dfl;
        memset(&dfl, 0, sizeof dfl);
        dfl.sa_handler = SIG_DFL;
        real_sigaction(SIGSEGV, &dfl, NULL);
        if (info->si_code <= 0) raise(sig);
    }
}

static sigaction_fn get_real_sigaction(void) {
    if (!real_sigaction) real_sigaction = (sigaction_fn)dlsym(RTLD_NEXT, "sigaction");
    return real_sigaction;
}

int sigaction(int sig, const struct sigaction *act, struct sigaction *old) {
    if (sig == SIGSEGV && active) {
        if (old) *old = program_handler;
        if (act) program_handler = *act;
        return 0;
    }
    return get_real_sigaction()(sig, act, old);
}

static sigset_t *without_segv(const sigset_t *set, sigset_t *copy) {
    if (!set || !active) return (sigset_t *)set;
    *copy = *set;
    sigdelset(copy, SIGSEGV);
    return copy;
}

int sigprocmask(int how, const sigset_t *set, sigset_t *old) {
    static sigmask_fn real;
    if (!real) real = (sigmask_fn)dlsym(RTLD_NEXT, "sigprocmask");
    sigset_t copy;
    return real(how, how == SIG_UNBLOCK ? set : without_segv(set, &copy), old);
}

int pthread_sigmask(int how, const sigset_t *set, sigset_t *old) {
    static sigmask_fn real;
    if (!real) real = (sigmask_fn)dlsym(RTLD_NEXT, "pthread_sigmask");
    sigset_t copy;
    return real(how, how == SIG_UNBLOCK ? set : without_segv(set, &copy), old);
}

sighandler_t signal(int sig, sighandler_t handler) {
    struct sigaction act, old;
    memset(&act, 0, sizeof act);
    act.sa_handler = handler;
    act.sa_flags = SA_RESTART;
    sigemptyset(&act.sa_mask);
    if (sigaction(sig, &act, &old) != 0) return SIG_ERR;
    return old.sa_handler;
}

static void report(void) {
    fprintf(stderr, "cpuid_mask: pid %d emulated %lu cpuid instructions\n", (int)getpid(), emulated);
}

__attribute__((constructor)) static void install(void) {
    struct sigaction act;
    memset(&act, 0, sizeof act);
    act.sa_sigaction = on_segv;
    act.sa_flags = SA_SIGINFO | SA_RESTART | SA_NODEFER;
    sigemptyset(&act.sa_mask);
    memset(&program_handler, 0, sizeof program_handler);
    program_handler.sa_handler = SIG_DFL;
    /* keep what was there (a handler from an earlier constructor, or SIG_IGN inherited over exec) */
    if (get_real_sigaction()(SIGSEGV, &act, &program_handler) != 0) {
        perror("cpuid_mask: sigaction");
        return;
    }
    if (set_cpuid_enabled(0) != 0) {
        perror("cpuid_mask: arch_prctl(ARCH_SET_CPUID) (no cpuid_fault on this CPU?)");
        exit(97);
    }
    active = 1;
    const char *rep = getenv("CPUID_MASK_REPORT");
    if (rep && rep[0] == '1') atexit(report);
}
