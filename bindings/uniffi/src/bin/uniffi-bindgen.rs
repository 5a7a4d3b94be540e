//! uniffi's bindings generator, built from the library's own uniffi version:
//! `uniffi-bindgen generate --library libopenshell_uniffi.so --language kotlin`.

fn main() {
    uniffi::uniffi_bindgen_main()
}
