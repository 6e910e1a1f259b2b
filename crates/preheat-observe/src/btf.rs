//! The lookups the observer needs in the kernel's BTF (pure: no I/O, never panics): a
//! tracepoint's typedef, and where a field of a kernel struct lies.
//!
//! A BTF-typed raw tracepoint program (`BPF_PROG_TYPE_TRACING`, attach type `BPF_TRACE_RAW_TP`)
//! names its tracepoint by the id of the typedef `btf_trace_<tracepoint>` in the kernel's own
//! BTF (`/sys/kernel/btf/vmlinux`). In exchange the verifier knows the tracepoint's argument
//! types, so the program reads `struct pt_regs` fields with plain loads instead of a
//! `bpf_probe_read_kernel` call each ([`crate::bpfprog`]).
//!
//! The format (`Documentation/bpf/btf.rst`): a header (magic `0xeB9F`, version, flags, header
//! length, then the offsets and lengths of the type and string sections, relative to the end
//! of the header); the type section is a sequence of 12-byte `struct btf_type` records (name
//! offset, info — kind in bits 24–28, count of members in bits 0–15 —, size or type), each
//! followed by data whose length depends on its kind; type ids count from 1 in that order.
#![forbid(unsafe_code)]
#![cfg_attr(
    not(test),
    deny(
        clippy::indexing_slicing,
        clippy::unwrap_used,
        clippy::expect_used,
        clippy::panic,
        clippy::arithmetic_side_effects
    )
)]

use crate::decode::{u16_at, u32_at};

const MAGIC: u16 = 0xeb9f;
const KIND_INT: u32 = 1;
const KIND_PTR: u32 = 2;
const KIND_STRUCT: u32 = 4;
const KIND_UNION: u32 = 5;
const KIND_ENUM: u32 = 6;
const KIND_TYPEDEF: u32 = 8;
const KIND_ENUM64: u32 = 19;

/// Bytes of kind-specific data after a type record of `kind` with `vlen` members; `None` for a
/// kind this reader does not know (a newer kernel's: the walk cannot go past it).
fn extra_len(kind: u32, vlen: usize) -> Option<usize> {
    match kind {
        1 | 14 | 17 => Some(4),                  // INT, VAR, DECL_TAG
        2 | 7..=12 | 16 | 18 => Some(0), // PTR, FWD, TYPEDEF, modifiers, FUNC, FLOAT, TYPE_TAG
        3 => Some(12),                   // ARRAY
        4 | 5 | 15 | 19 => vlen.checked_mul(12), // STRUCT, UNION, DATASEC, ENUM64
        6 | 13 => vlen.checked_mul(8),   // ENUM, FUNC_PROTO
        _ => None,
    }
}

/// The NUL-terminated string at `off` of the string section `strs`.
fn string_at(strs: &[u8], off: usize) -> Option<&[u8]> {
    let s = strs.get(off..)?;
    let end = s.iter().position(|&c| c == 0)?;
    s.get(..end)
}

/// One type record: where its kind-specific data lies in the type section.
#[derive(Debug, Clone, Copy)]
struct Type {
    name_off: u32,
    info: u32,
    /// Size (structs, unions, ints) or the type referred to (typedefs, pointers, modifiers).
    size_or_type: u32,
    /// Offset of its kind-specific data in the type section.
    data: usize,
}

impl Type {
    fn kind(&self) -> u32 {
        (self.info >> 24) & 0x1f
    }
    fn vlen(&self) -> usize {
        (self.info & 0xffff) as usize
    }
}

/// The kernel's BTF, indexed by type id once (the records are read in place), for any number
/// of lookups.
pub struct Btf<'a> {
    types: &'a [u8],
    strs: &'a [u8],
    /// Index `id - 1`.
    index: Vec<Type>,
}

impl<'a> Btf<'a> {
    /// Index the raw BTF `raw` (little-endian, as the running kernel's), or say why it cannot
    /// be read.
    pub fn parse(raw: &'a [u8]) -> Result<Btf<'a>, String> {
        let bad = || "malformed BTF".to_string();
        if u16_at(raw, 0) != Some(MAGIC) {
            return Err("not little-endian BTF (bad magic)".to_string());
        }
        let hdr = u32_at(raw, 4).ok_or_else(bad)? as usize;
        let field = |at: usize| u32_at(raw, at).map(|v| v as usize).ok_or_else(bad);
        let (type_off, type_len, str_off, str_len) =
            (field(8)?, field(12)?, field(16)?, field(20)?);
        let section = |off: usize, len: usize| {
            let start = hdr.checked_add(off)?;
            raw.get(start..start.checked_add(len)?)
        };
        let types = section(type_off, type_len).ok_or_else(bad)?;
        let strs = section(str_off, str_len).ok_or_else(bad)?;
        let mut index = Vec::new();
        let mut at = 0usize;
        while at < types.len() {
            let word = |k: usize| {
                at.checked_add(k)
                    .and_then(|a| u32_at(types, a))
                    .ok_or_else(bad)
            };
            let t = Type {
                name_off: word(0)?,
                info: word(4)?,
                size_or_type: word(8)?,
                data: at.checked_add(12).ok_or_else(bad)?,
            };
            let extra = extra_len(t.kind(), t.vlen()).ok_or_else(|| {
                format!(
                    "BTF type kind {} unknown to this reader (type {})",
                    t.kind(),
                    index.len().saturating_add(1)
                )
            })?;
            at = t.data.checked_add(extra).ok_or_else(bad)?;
            index.push(t);
        }
        Ok(Btf { types, strs, index })
    }

    fn name(&self, t: &Type) -> Option<&[u8]> {
        string_at(self.strs, t.name_off as usize)
    }

    fn get(&self, id: u32) -> Option<&Type> {
        self.index.get((id as usize).checked_sub(1)?)
    }

    /// The first type of `kind` named `name`: its id.
    fn find(&self, kind: u32, name: &str) -> Option<u32> {
        let i = self
            .index
            .iter()
            .position(|t| t.kind() == kind && self.name(t) == Some(name.as_bytes()))?;
        u32::try_from(i).ok()?.checked_add(1)
    }

    /// `id` with typedefs and modifiers (volatile, const, restrict, type tags) looked through.
    fn resolve(&self, mut id: u32) -> Option<&Type> {
        for _ in 0..32 {
            let t = self.get(id)?;
            match t.kind() {
                KIND_TYPEDEF | 9..=11 | 18 => id = t.size_or_type,
                _ => return Some(t),
            }
        }
        None
    }

    /// Member `name` of the struct or union `t`, looking into anonymous struct and union
    /// members as C does: its byte offset from `t`'s start and its type id. Bitfields are not
    /// members this reader returns.
    fn member(&self, t: &Type, name: &str, depth: u32) -> Option<(u32, u32)> {
        if !matches!(t.kind(), KIND_STRUCT | KIND_UNION) || depth > 8 {
            return None;
        }
        let bitfields = t.info >> 31 == 1;
        for i in 0..t.vlen() {
            let at = t.data.checked_add(i.checked_mul(12)?)?;
            let word = |k: usize| u32_at(self.types, at.checked_add(k)?);
            let (name_off, ty, offset) = (word(0)?, word(4)?, word(8)?);
            let (bits, bit_size) = if bitfields {
                (offset & 0x00ff_ffff, offset >> 24)
            } else {
                (offset, 0)
            };
            if bits % 8 != 0 || bit_size != 0 {
                continue;
            }
            let here = bits / 8;
            match string_at(self.strs, name_off as usize) {
                Some(n) if n == name.as_bytes() => return Some((here, ty)),
                Some([]) => {
                    if let Some((off, ty)) = self
                        .resolve(ty)
                        .and_then(|inner| self.member(inner, name, depth.saturating_add(1)))
                    {
                        return Some((here.checked_add(off)?, ty));
                    }
                }
                _ => {}
            }
        }
        None
    }
}

impl Btf<'_> {
    /// The id of the typedef named `name`, or why there is none.
    pub fn typedef_id(&self, name: &str) -> Result<u32, String> {
        self.find(KIND_TYPEDEF, name)
            .ok_or_else(|| format!("no typedef {name} in the kernel's BTF"))
    }

    /// Where the field `path` (member names from `strukt` down, as in C:
    /// `__sk_common.skc_num`; anonymous structs and unions looked into) lies in `struct
    /// strukt`: its byte offset and its size in bytes (an integer, enum or pointer field), or
    /// why it cannot be had.
    pub fn field(&self, strukt: &str, path: &str) -> Result<(u32, u32), String> {
        let missing = || format!("no field {strukt}.{path} in the kernel's BTF");
        let mut t = self
            .find(KIND_STRUCT, strukt)
            .and_then(|id| self.get(id))
            .ok_or_else(|| format!("no struct {strukt} in the kernel's BTF"))?;
        let mut offset = 0u32;
        for name in path.split('.') {
            let (off, ty) = self.member(t, name, 0).ok_or_else(missing)?;
            offset = offset.checked_add(off).ok_or_else(missing)?;
            t = self.resolve(ty).ok_or_else(missing)?;
        }
        let size = match t.kind() {
            KIND_INT | KIND_ENUM | KIND_ENUM64 => t.size_or_type,
            KIND_PTR => 8,
            k => return Err(format!("{strukt}.{path} is of BTF kind {k}, not a scalar")),
        };
        Ok((offset, size))
    }
}

/// [`Btf::typedef_id`] in the raw BTF `raw`, indexed for this one lookup.
pub fn typedef_id(raw: &[u8], name: &str) -> Result<u32, String> {
    Btf::parse(raw)?.typedef_id(name)
}

/// [`Btf::field`] in the raw BTF `raw`, indexed for this one lookup.
pub fn field(raw: &[u8], strukt: &str, path: &str) -> Result<(u32, u32), String> {
    Btf::parse(raw)?.field(strukt, path)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A BTF blob: the header, then the type and string sections.
    fn assemble(ty: &[u8], strs: &[u8]) -> Vec<u8> {
        let mut b = Vec::new();
        b.extend_from_slice(&MAGIC.to_le_bytes());
        b.extend_from_slice(&[1, 0]);
        b.extend_from_slice(&24u32.to_le_bytes());
        for v in [0, ty.len() as u32, ty.len() as u32, strs.len() as u32] {
            b.extend_from_slice(&v.to_le_bytes());
        }
        b.extend_from_slice(ty);
        b.extend_from_slice(strs);
        b
    }

    /// A BTF blob of `types` (kind, vlen, name) with zeroed kind data, and its strings.
    fn blob(types: &[(u32, u32, &str)]) -> Vec<u8> {
        let mut strs = vec![0u8];
        let mut ty = Vec::new();
        for &(kind, vlen, name) in types {
            let off = strs.len() as u32;
            strs.extend_from_slice(name.as_bytes());
            strs.push(0);
            ty.extend_from_slice(&off.to_le_bytes());
            ty.extend_from_slice(&((kind << 24) | vlen).to_le_bytes());
            ty.extend_from_slice(&0u32.to_le_bytes());
            ty.resize(ty.len() + extra_len(kind, vlen as usize).unwrap(), 0);
        }
        assemble(&ty, &strs)
    }

    #[test]
    fn finds_a_typedef_after_types_of_every_size() {
        let b = blob(&[
            (1, 0, "int"),
            (4, 3, "pt_regs"),
            (13, 2, ""),
            (6, 5, "e"),
            (8, 0, "btf_trace_sys_enter"),
            (8, 0, "btf_trace_sys_exit"),
        ]);
        assert_eq!(typedef_id(&b, "btf_trace_sys_enter"), Ok(5));
        assert_eq!(typedef_id(&b, "btf_trace_sys_exit"), Ok(6));
        // A struct of that name is no typedef.
        assert!(typedef_id(&b, "pt_regs")
            .unwrap_err()
            .contains("no typedef"));
    }

    /// A BTF blob of `types` (kind, name, size or type, members as (name, type, bit offset)),
    /// kind data zeroed where it is not members.
    /// A member: its name, type id and bit offset.
    type Member<'a> = (&'a str, u32, u32);

    fn blob_with(types: &[(u32, &str, u32, &[Member])]) -> Vec<u8> {
        let mut strs = vec![0u8];
        let mut name = |n: &str| {
            let off = strs.len() as u32;
            strs.extend_from_slice(n.as_bytes());
            strs.push(0);
            off
        };
        let mut ty = Vec::new();
        for &(kind, n, size, members) in types {
            let vlen = members.len() as u32;
            for v in [name(n), (kind << 24) | vlen, size] {
                ty.extend_from_slice(&v.to_le_bytes());
            }
            if members.is_empty() {
                ty.resize(ty.len() + extra_len(kind, 0).unwrap(), 0);
            }
            for &(m, t, bits) in members {
                for v in [name(m), t, bits] {
                    ty.extend_from_slice(&v.to_le_bytes());
                }
            }
        }
        assemble(&ty, &strs)
    }

    #[test]
    fn finds_fields_through_anonymous_members_and_typedefs() {
        let b = blob_with(&[
            (KIND_INT, "u16", 2, &[]),
            (KIND_TYPEDEF, "__u16", 1, &[]),
            (KIND_UNION, "", 4, &[("skc_portpair", 1, 0), ("", 4, 0)]),
            (
                KIND_STRUCT,
                "",
                4,
                &[("skc_dport", 1, 0), ("skc_num", 2, 16)],
            ),
            (
                KIND_STRUCT,
                "sock_common",
                16,
                &[("skc_daddr", 1, 0), ("", 3, 96)],
            ),
            (
                KIND_STRUCT,
                "sock",
                32,
                &[("__sk_common", 5, 0), ("sk_rx", 7, 128)],
            ),
            (KIND_PTR, "", 1, &[]),
        ]);
        assert_eq!(field(&b, "sock", "__sk_common.skc_num"), Ok((14, 2)));
        assert_eq!(field(&b, "sock_common", "skc_dport"), Ok((12, 2)));
        assert_eq!(field(&b, "sock", "sk_rx"), Ok((16, 8)));
        assert!(field(&b, "sock", "__sk_common")
            .unwrap_err()
            .contains("not a scalar"));
        assert!(field(&b, "sock", "skc_nope")
            .unwrap_err()
            .contains("no field"));
        assert!(field(&b, "task_struct", "pid")
            .unwrap_err()
            .contains("no struct"));
        for n in 0..b.len() {
            let _ = field(&b[..n], "sock", "__sk_common.skc_num");
        }
    }

    #[test]
    fn bad_input_is_an_error_never_a_panic() {
        assert!(typedef_id(&[], "x").is_err());
        assert!(typedef_id(&[0x9f, 0xeb], "x").is_err());
        let b = blob(&[(4, 3, "s"), (8, 0, "t")]);
        for n in 0..b.len() {
            let _ = typedef_id(&b[..n], "t");
        }
        let mut unknown = blob(&[(8, 0, "z"), (8, 0, "t")]);
        unknown[24 + 4 + 3] = 31;
        assert!(typedef_id(&unknown, "t").unwrap_err().contains("unknown"));
    }

    #[test]
    fn the_running_kernels_btf_has_the_syscall_tracepoints_where_readable() {
        let Ok(raw) = std::fs::read("/sys/kernel/btf/vmlinux") else {
            return; // no BTF here: nothing to check (the observer falls back)
        };
        assert!(typedef_id(&raw, "btf_trace_sys_enter").is_ok());
        assert!(typedef_id(&raw, "btf_trace_sys_exit").is_ok());
        // The scheduler form's fields, sized as its programs load them.
        assert_eq!(field(&raw, "task_struct", "pid").map(|f| f.1), Ok(4));
        assert_eq!(field(&raw, "task_struct", "tgid").map(|f| f.1), Ok(4));
        assert_eq!(
            field(&raw, "sock", "__sk_common.skc_num").map(|f| f.1),
            Ok(2)
        );
        assert_eq!(
            field(&raw, "sock", "__sk_common.skc_dport").map(|f| f.1),
            Ok(2)
        );
        assert_eq!(
            field(&raw, "sock", "__sk_common.skc_daddr").map(|f| f.1),
            Ok(4)
        );
    }
}
