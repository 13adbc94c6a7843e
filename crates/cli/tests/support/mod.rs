//! Support shared by this crate's integration tests (each test target includes what it uses).

#![allow(dead_code)]

pub mod sse;
