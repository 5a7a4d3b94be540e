//! Core errors as Python exceptions.
//!
//! The exception classes live in Python (`openshell_sdk.errors`), so that
//! they are ordinary, documented, picklable classes. This module calls that
//! module's `_from_native(code, message, grpc_status, retryable, metadata)`
//! to build the instance; the string `code` is the core's stable code and
//! selects the subclass.
//!
//! Conversion needs the GIL, so an async call does not convert inside the
//! tokio task: it returns an [`Answer`], which the event loop's thread
//! converts when it settles the asyncio future (the `waker` module).

use pyo3::BoundObject;
use pyo3::exceptions::PyRuntimeError;
use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;

static FACTORY: PyOnceLock<Py<PyAny>> = PyOnceLock::new();

fn factory(py: Python<'_>) -> PyResult<&Bound<'_, PyAny>> {
    FACTORY
        .get_or_try_init(py, || {
            Ok::<_, PyErr>(
                py.import("openshell_sdk.errors")?
                    .getattr("_from_native")?
                    .unbind(),
            )
        })
        .map(|f| f.bind(py))
}

/// The Python exception for a core error.
pub fn to_py(py: Python<'_>, err: &openshell_sdk::Error) -> PyErr {
    let metadata: Vec<(String, String)> = err
        .metadata()
        .map(|m| {
            m.iter()
                .map(|(k, v)| (k.to_owned(), v.to_owned()))
                .collect()
        })
        .unwrap_or_default();
    let built = factory(py).and_then(|f| {
        f.call1((
            err.code(),
            err.message(),
            err.grpc_code() as i32,
            err.retryable(),
            metadata,
        ))
    });
    let built = built.and_then(|instance| {
        // A local cluster's failure names the directory its logs were kept in.
        if let Some(logs) = err.logs() {
            instance.setattr("logs", logs.display().to_string())?;
        }
        Ok(instance)
    });
    match built {
        Ok(instance) => PyErr::from_value(instance),
        Err(import_failed) => {
            let fallback = PyRuntimeError::new_err(format!("{}: {}", err.code(), err.message()));
            fallback.set_cause(py, Some(import_failed));
            fallback
        }
    }
}

/// A core result on its way to Python: `Ok` converts as `T`, `Err` raises
/// the matching exception.
pub struct Answer<T>(pub Result<T, openshell_sdk::Error>);

impl<'py, T> IntoPyObject<'py> for Answer<T>
where
    T: IntoPyObject<'py>,
{
    type Target = PyAny;
    type Output = Bound<'py, PyAny>;
    type Error = PyErr;

    fn into_pyobject(self, py: Python<'py>) -> Result<Self::Output, Self::Error> {
        match self.0 {
            Ok(value) => value
                .into_pyobject(py)
                .map(BoundObject::into_any)
                .map(BoundObject::into_bound)
                .map_err(Into::into),
            Err(err) => Err(to_py(py, &err)),
        }
    }
}

/// An `invalid_config` error raised before any I/O.
pub fn invalid_config(py: Python<'_>, message: impl Into<String>) -> PyErr {
    to_py(py, &openshell_sdk::Error::invalid_config(message))
}
