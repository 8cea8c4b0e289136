#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| headroom_fuzz::bundle_import(data));
