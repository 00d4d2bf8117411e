//! The upstream simulator, started in-process on 127.0.0.1:0 (owned by the simulator work).
