//! Raw HTTP/2 frames, written and read by the flood tests.

/// One frame: the 9-byte head, then the payload.
pub(super) fn frame(kind: u8, flags: u8, stream: u32, payload: &[u8]) -> Vec<u8> {
    let len = u32::try_from(payload.len()).expect("small frame").to_be_bytes();
    let mut f = vec![len[1], len[2], len[3], kind, flags];
    f.extend_from_slice(&stream.to_be_bytes());
    f.extend_from_slice(payload);
    f
}

/// The GOAWAY frames' error codes in what the server sent.
pub(super) fn goaway_codes(bytes: &[u8]) -> Vec<u32> {
    let mut codes = Vec::new();
    let mut at = 0;
    while at + 9 <= bytes.len() {
        let len = usize::from(bytes[at]) << 16 | usize::from(bytes[at + 1]) << 8 | usize::from(bytes[at + 2]);
        if bytes[at + 3] == 0x7 && at + 9 + 8 <= bytes.len() {
            let p = &bytes[at + 9..];
            codes.push(u32::from_be_bytes([p[4], p[5], p[6], p[7]]));
        }
        at += 9 + len;
    }
    codes
}
