//! The userfaultfd ABI of `<linux/userfaultfd.h>` (x86-64) the agent's two userfaultfd users
//! share: the write-protect mechanism ([`super::uffd`]) and the written-page tracking
//! ([`super::written`]).

pub const UFFD_API: u64 = 0xAA;
pub const UFFD_FEATURE_PAGEFAULT_FLAG_WP: u64 = 1 << 0;
pub const UFFD_FEATURE_THREAD_ID: u64 = 1 << 8;
pub const UFFD_FEATURE_WP_UNPOPULATED: u64 = 1 << 13;
pub const UFFD_FEATURE_WP_ASYNC: u64 = 1 << 15;
pub const UFFDIO_REGISTER_MODE_WP: u64 = 1 << 1;
pub const UFFDIO_WRITEPROTECT_MODE_WP: u64 = 1 << 0;
pub const UFFD_EVENT_PAGEFAULT: u8 = 0x12;

/// `_IOWR(ty, nr, size)` and `_IOR(ty, nr, size)`.
pub const fn iowr(ty: u64, nr: u64, size: u64) -> u64 {
    (3 << 30) | (size << 16) | (ty << 8) | nr
}
pub const fn ior(ty: u64, nr: u64, size: u64) -> u64 {
    (2 << 30) | (size << 16) | (ty << 8) | nr
}
pub const UFFDIO_API: u64 = iowr(0xAA, 0x3F, 24);
pub const UFFDIO_REGISTER: u64 = iowr(0xAA, 0x00, 32);
pub const UFFDIO_UNREGISTER: u64 = ior(0xAA, 0x01, 16);
pub const UFFDIO_WRITEPROTECT: u64 = iowr(0xAA, 0x06, 24);

#[repr(C)]
pub struct UffdioApi {
    pub api: u64,
    pub features: u64,
    pub ioctls: u64,
}

#[repr(C)]
#[derive(Clone, Copy)]
pub struct UffdioRange {
    pub start: u64,
    pub len: u64,
}

#[repr(C)]
pub struct UffdioRegister {
    pub range: UffdioRange,
    pub mode: u64,
    pub ioctls: u64,
}

#[repr(C)]
pub struct UffdioWriteprotect {
    pub range: UffdioRange,
    pub mode: u64,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ioctl_numbers_match_the_kernel_header() {
        // Values of <linux/userfaultfd.h> on x86-64.
        assert_eq!(UFFDIO_API, 0xc018_aa3f);
        assert_eq!(UFFDIO_REGISTER, 0xc020_aa00);
        assert_eq!(UFFDIO_UNREGISTER, 0x8010_aa01);
        assert_eq!(UFFDIO_WRITEPROTECT, 0xc018_aa06);
        assert_eq!(std::mem::size_of::<UffdioRegister>(), 32);
        assert_eq!(std::mem::size_of::<UffdioWriteprotect>(), 24);
    }
}
