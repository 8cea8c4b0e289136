//! What a buffer holds: element type, shape, strides and memory tier. Kept apart from the
//! allocator so shape arithmetic (overflow, bounds of aliases) is checked in one place.

use std::fmt;

use smallvec::SmallVec;

/// Dimensions stored inline up to rank 4, so typical buffers allocate no shape on the heap.
type Dims = SmallVec<[usize; 4]>;

/// The memory tier a buffer lives in. Kernels see three tiers with very different capacity.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Scope {
    /// Device global memory (HBM): large but slow.
    Global,
    /// The on-chip shared/unified buffer of a block or core.
    Shared,
    /// Register-level local memory.
    Local,
}

impl Scope {
    /// Every tier, in the order statistics and snapshots list them.
    pub const ALL: [Scope; 3] = [Scope::Global, Scope::Shared, Scope::Local];

    /// Position in [`Scope::ALL`], for per-tier tables.
    pub fn index(self) -> usize {
        self as usize
    }

    /// Lower-case name used in messages, stats and traces.
    pub fn name(self) -> &'static str {
        match self {
            Scope::Global => "global",
            Scope::Shared => "shared",
            Scope::Local => "local",
        }
    }

    /// Parses the name written by [`Scope::name`].
    pub fn from_name(name: &str) -> Option<Scope> {
        Scope::ALL.into_iter().find(|scope| scope.name() == name)
    }
}

impl fmt::Display for Scope {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// Element types of device buffers.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum DType {
    Bool,
    U8,
    I8,
    I16,
    I32,
    I64,
    F16,
    BF16,
    F32,
    F64,
}

impl DType {
    /// Bytes per element.
    pub const fn size_of(self) -> usize {
        match self {
            DType::Bool | DType::U8 | DType::I8 => 1,
            DType::I16 | DType::F16 | DType::BF16 => 2,
            DType::I32 | DType::F32 => 4,
            DType::I64 | DType::F64 => 8,
        }
    }
}

/// Rust types that may be copied to and from buffers of a matching [`DType`].
///
/// # Safety
/// Implementors must be plain old data: every bit pattern valid, no padding, no pointers.
pub unsafe trait Element: Copy + Send + Sync + 'static {
    /// The dtype a buffer must have to hold this type.
    const DTYPE: DType;
}

macro_rules! element {
    ($($ty:ty => $dtype:ident),* $(,)?) => {
        // SAFETY: primitive integers and floats are plain old data.
        $(unsafe impl Element for $ty { const DTYPE: DType = DType::$dtype; })*
    };
}
element!(u8 => U8, i8 => I8, i16 => I16, i32 => I32, i64 => I64, f32 => F32, f64 => F64);

/// Dimensions of a buffer. Build it from an array when the rank and sizes are fixed at
/// compile time (`Shape::from([4, 128])`), or from a `Vec`/slice when they are only known at
/// run time (`Shape::from(dims_from_config)`).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Shape(Dims);

impl Shape {
    /// A shape with the given dimensions (an empty list is a scalar).
    pub fn new(dims: impl Into<Vec<usize>>) -> Self {
        Shape(Dims::from_vec(dims.into()))
    }

    pub fn dims(&self) -> &[usize] {
        &self.0
    }

    pub fn rank(&self) -> usize {
        self.0.len()
    }

    /// Number of elements, or `None` when it overflows `usize`.
    pub fn checked_numel(&self) -> Option<usize> {
        self.0
            .iter()
            .try_fold(1usize, |acc, &dim| acc.checked_mul(dim))
    }

    /// Row-major (C-contiguous) strides in elements.
    pub fn contiguous_strides(&self) -> Dims {
        let mut strides: Dims = SmallVec::from_elem(1, self.0.len());
        for axis in (0..self.0.len().saturating_sub(1)).rev() {
            strides[axis] = strides[axis + 1].saturating_mul(self.0[axis + 1]);
        }
        strides
    }
}

impl<const N: usize> From<[usize; N]> for Shape {
    fn from(dims: [usize; N]) -> Self {
        Shape(Dims::from_slice(&dims))
    }
}

impl From<Vec<usize>> for Shape {
    fn from(dims: Vec<usize>) -> Self {
        Shape(Dims::from_vec(dims))
    }
}

impl From<&[usize]> for Shape {
    fn from(dims: &[usize]) -> Self {
        Shape(Dims::from_slice(dims))
    }
}

impl fmt::Display for Shape {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:?}", self.0.as_slice())
    }
}

/// Shape, dtype and strides together: how the bytes of a buffer or alias are interpreted.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TensorLayout {
    shape: Shape,
    dtype: DType,
    strides: Dims,
}

impl TensorLayout {
    /// A contiguous layout; `None` when its byte size overflows.
    pub fn contiguous(shape: Shape, dtype: DType) -> Option<Self> {
        shape.checked_numel()?.checked_mul(dtype.size_of())?;
        let strides = shape.contiguous_strides();
        Some(TensorLayout {
            shape,
            dtype,
            strides,
        })
    }

    pub fn shape(&self) -> &Shape {
        &self.shape
    }

    pub fn dtype(&self) -> DType {
        self.dtype
    }

    /// Strides in elements, row-major.
    pub fn strides(&self) -> &[usize] {
        &self.strides
    }

    pub fn numel(&self) -> usize {
        // Checked at construction.
        self.shape.0.iter().product()
    }

    /// Bytes the layout spans.
    pub fn size_bytes(&self) -> u64 {
        (self.numel() * self.dtype.size_of()) as u64
    }
}

/// An alignment in bytes: a power of two, guaranteed by construction.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Alignment(u64);

impl Alignment {
    /// The alignment every pool block has without asking: 512 bytes like PyTorch's
    /// `kMinBlockSize`, enough for any vector load.
    pub const DEFAULT: Alignment = Alignment(512);

    /// `None` unless `bytes` is a non-zero power of two.
    pub const fn new(bytes: u64) -> Option<Self> {
        if bytes.is_power_of_two() {
            Some(Alignment(bytes))
        } else {
            None
        }
    }

    pub const fn bytes(self) -> u64 {
        self.0
    }
}

impl Default for Alignment {
    fn default() -> Self {
        Alignment::DEFAULT
    }
}

/// Rounds `value` up to a multiple of the power of two `align`.
pub const fn align_up(value: u64, align: u64) -> u64 {
    (value + align - 1) & !(align - 1)
}

/// Whether `address` is a multiple of `alignment`.
pub fn address_is_aligned(address: u64, alignment: Alignment) -> bool {
    address & (alignment.bytes() - 1) == 0
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn strides_are_row_major() {
        assert_eq!(
            Shape::from([2, 3, 4]).contiguous_strides().as_slice(),
            &[12, 4, 1]
        );
        assert!(Shape::from([]).contiguous_strides().is_empty());
    }

    #[test]
    fn overflowing_shapes_have_no_layout() {
        assert!(TensorLayout::contiguous(Shape::from([usize::MAX, 2]), DType::F32).is_none());
        let layout = TensorLayout::contiguous(Shape::new(vec![3, 5]), DType::BF16).unwrap();
        assert_eq!(layout.size_bytes(), 30);
    }

    #[test]
    fn alignment_must_be_a_power_of_two() {
        assert!(Alignment::new(0).is_none());
        assert!(Alignment::new(48).is_none());
        assert_eq!(Alignment::new(4096).map(Alignment::bytes), Some(4096));
        assert!(address_is_aligned(8192, Alignment::new(4096).unwrap()));
        assert!(!address_is_aligned(8193, Alignment::new(2).unwrap()));
        assert_eq!(align_up(513, 512), 1024);
    }
}
