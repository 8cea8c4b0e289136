//! Element types by the names Python users write: strings (`"float32"`, `"bf16"`), NumPy
//! dtypes and scalar types, and torch dtypes, all to headroom-mem's [`DType`].

use headroom_mem::DType;
use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use pyo3::types::{PyString, PyType};

/// Every dtype with its canonical (NumPy and torch) name and the other names accepted.
const NAMES: [(DType, &str, &[&str]); 10] = [
    (DType::Bool, "bool", &["bool_"]),
    (DType::U8, "uint8", &["u8"]),
    (DType::I8, "int8", &["i8"]),
    (DType::I16, "int16", &["i16", "short"]),
    (DType::I32, "int32", &["i32", "int"]),
    (DType::I64, "int64", &["i64", "long"]),
    (DType::F16, "float16", &["f16", "half"]),
    (DType::BF16, "bfloat16", &["bf16"]),
    (DType::F32, "float32", &["f32", "float"]),
    (DType::F64, "float64", &["f64", "double"]),
];

/// The canonical name of a dtype: `"float32"`.
pub fn name(dtype: DType) -> &'static str {
    NAMES
        .iter()
        .find(|(d, _, _)| *d == dtype)
        .map(|(_, name, _)| *name)
        .expect("every DType is listed in NAMES")
}

/// A dtype by any of its names.
pub fn from_name(text: &str) -> Option<DType> {
    let text = text.strip_prefix("torch.").unwrap_or(text);
    NAMES
        .iter()
        .find(|(_, name, aliases)| *name == text || aliases.contains(&text))
        .map(|(dtype, _, _)| *dtype)
}

/// A dtype from a string, a NumPy dtype or scalar type (`numpy.float32`), or a torch dtype.
pub fn extract(value: &Bound<'_, PyAny>) -> PyResult<DType> {
    let text = if let Ok(text) = value.cast::<PyString>() {
        text.to_string()
    } else if let Ok(class) = value.cast::<PyType>() {
        // numpy.float32 and friends are classes named after their dtype.
        class.name()?.to_string()
    } else {
        // numpy.dtype("float32") prints as "float32", torch.float32 as "torch.float32".
        value.str()?.to_string()
    };
    from_name(&text).ok_or_else(|| {
        let accepted: Vec<&str> = NAMES.iter().map(|(_, name, _)| *name).collect();
        PyValueError::new_err(format!(
            "dtype {} is not supported; use one of {} (as a string, a NumPy dtype or a torch dtype)",
            value.repr().map(|r| r.to_string()).unwrap_or(text),
            accepted.join(", ")
        ))
    })
}
