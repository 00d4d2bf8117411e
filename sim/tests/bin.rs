//! The `permit-api-sim` binary: prints its bound address first, then serves.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::process::{Command, Stdio};

#[test]
fn binary_prints_its_address_first_and_serves_on_it() {
    let mut child = Command::new(env!("CARGO_BIN_EXE_permit-api-sim"))
        .args(["--listen", "127.0.0.1:0", "--credit-limit", "10", "--api-key", "k1"])
        .stdout(Stdio::piped())
        .spawn()
        .expect("binary starts");
    let stdout = child.stdout.take().expect("stdout is piped");
    let mut first = String::new();
    BufReader::new(stdout).read_line(&mut first).expect("first line");
    let addr = first.trim().to_string();
    assert!(addr.starts_with("127.0.0.1:") && !addr.ends_with(":0"), "{addr}");

    let mut conn = TcpStream::connect(&addr).expect("connects");
    let req = "GET /v2/usage HTTP/1.1\r\nHost: sim\r\nX-API-Key: k1\r\nConnection: close\r\n\r\n";
    conn.write_all(req.as_bytes()).expect("request sent");
    let mut answer = String::new();
    conn.read_to_string(&mut answer).expect("answer read");
    let _ = child.kill();
    let _ = child.wait();
    assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
    assert!(answer.contains("\"credit_limit\":10"), "{answer}");
}
