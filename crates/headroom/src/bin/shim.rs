//! `headroom-shim`: the compiler shim alone, as its own small binary. Every compiler call of a
//! governed build starts it, so it should load fast: the full CLI binary carries tens of
//! thousands of relocations the shim has no use for. `headroom build` links the shim names to
//! this binary when it sits next to `headroom`, and to `headroom` itself otherwise.

fn main() {
    headroom_govern::shim::main(std::env::args_os().collect())
}
