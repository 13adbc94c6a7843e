//! A local OpenAI-compatible server (127.0.0.1) that answers each chat-completions request with
//! a server-sent-event stream chosen from the request's body, and logs every exchange.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::sync::Arc;
use std::thread;

use parking_lot::Mutex;
use serde_json::Value;

/// One request the server answered: what it replayed (a name the reply function gives), the
/// request's headers and JSON body.
#[derive(Clone, Debug)]
pub struct Exchange {
    pub replayed: &'static str,
    pub head: String,
    pub body: Value,
}

/// The recorded event stream `tests/fixtures/<name>`.
pub fn recording(name: &str) -> Vec<u8> {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures")
        .join(name);
    std::fs::read(&path).unwrap_or_else(|e| panic!("fixture {}: {e}", path.display()))
}

/// Reads one HTTP/1.1 request: the head and a `content-length` body.
pub fn read_request(stream: &mut TcpStream) -> Option<(String, Vec<u8>)> {
    let mut reader = BufReader::new(stream.try_clone().ok()?);
    let mut head = String::new();
    loop {
        let mut line = String::new();
        if reader.read_line(&mut line).ok()? == 0 {
            return None;
        }
        if line == "\r\n" {
            break;
        }
        head.push_str(&line);
    }
    let length = head
        .lines()
        .find_map(|l| {
            let (k, v) = l.split_once(':')?;
            k.eq_ignore_ascii_case("content-length")
                .then(|| v.trim().parse::<usize>().ok())?
        })
        .unwrap_or(0);
    let mut body = vec![0; length];
    reader.read_exact(&mut body).ok()?;
    Some((head, body))
}

/// Serves on 127.0.0.1 until the process ends, answering each request with the event stream
/// `reply` gives for its JSON body (with a name for the log); returns the base URL (up to
/// `/v1`) and the log of exchanges.
pub fn serve(
    reply: impl Fn(&Value) -> (&'static str, Vec<u8>) + Send + 'static,
) -> (String, Arc<Mutex<Vec<Exchange>>>) {
    let listener = TcpListener::bind("127.0.0.1:0").expect("bind 127.0.0.1");
    let base = format!("http://{}/v1", listener.local_addr().expect("local addr"));
    let log: Arc<Mutex<Vec<Exchange>>> = Arc::default();
    let seen = log.clone();
    thread::spawn(move || {
        for stream in listener.incoming() {
            let Ok(mut stream) = stream else { continue };
            let Some((head, body)) = read_request(&mut stream) else {
                continue;
            };
            let body: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
            let (replayed, events) = reply(&body);
            seen.lock().push(Exchange { replayed, head, body });
            let _ = stream.write_all(
                b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ncache-control: no-cache\r\n\
                  x-request-id: req_replay\r\nconnection: close\r\n\r\n",
            );
            let _ = stream.write_all(&events);
            let _ = stream.flush();
        }
    });
    (base, log)
}

/// One streamed completion chunk (`delta`, optional `finish_reason`) as an SSE event.
fn event(delta: Value, finish: Option<&str>) -> String {
    let chunk = serde_json::json!({"id": "chatcmpl-test", "object": "chat.completion.chunk", "created": 1,
        "model": "test-model", "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]});
    format!("data: {chunk}\n\n")
}

/// A completion stream answering `text`.
pub fn text_stream(text: &str) -> Vec<u8> {
    [
        event(serde_json::json!({"role": "assistant", "content": ""}), None),
        event(serde_json::json!({"content": text}), None),
        event(serde_json::json!({}), Some("stop")),
        "data: [DONE]\n\n".to_owned(),
    ]
    .concat()
    .into_bytes()
}

/// A completion stream calling tool `name` with `arguments` (call id `call_1`).
pub fn tool_call_stream(name: &str, arguments: &Value) -> Vec<u8> {
    let call = serde_json::json!({"tool_calls": [{"index": 0, "id": "call_1", "type": "function",
        "function": {"name": name, "arguments": arguments.to_string()}}]});
    [
        event(serde_json::json!({"role": "assistant", "content": ""}), None),
        event(call, None),
        event(serde_json::json!({}), Some("tool_calls")),
        "data: [DONE]\n\n".to_owned(),
    ]
    .concat()
    .into_bytes()
}
