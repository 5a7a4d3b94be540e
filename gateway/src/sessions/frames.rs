//! Relay frames as the bytes they arrived in. The gateway's relay routes
//! (`raw_routes`: exec, interactive exec, `ForwardTcp`, `RelayStream`) read
//! and answer gRPC messages through `openshell_sdk::wire`, so a relay
//! carries encoded `RelayFrame`s behind their gRPC prefix ("framed"), not
//! decoded ones. A data frame is passed between a forward and its relay as
//! it is, prefix and all, in the chunk it arrived in: `TcpForwardFrame` and
//! `RelayFrame` both carry their payload in field 2 (`bytes data`), so one
//! such message is the same bytes as either. An exec's stdout or stderr
//! event is sent on as the supervisor encoded it inside its relay frame
//! ([`exec_output`]). Every other frame is decoded, and built frames are
//! encoded once.

use bytes::Bytes;
use openshell_sdk::wire::{Outbound, PREFIX_LEN, frame_message};
use tonic::Status;

/// The first byte of field 2 with the length-delimited wire type: `data`
/// in `TcpForwardFrame` and `RelayFrame`.
const DATA_TAG: u8 = (2 << 3) | 2;

/// The message of a framed one (after its prefix).
fn message_of(framed: &[u8]) -> &[u8] {
    &framed[PREFIX_LEN.min(framed.len())..]
}

/// Where the one field of `message` lies when `message` is the field `tag`
/// (its key, as encoded) with a length-delimited value and nothing else:
/// the value's start and length. How every encoder writes a message of one
/// set oneof field.
fn only_field(message: &[u8], tag: &[u8]) -> Option<(usize, usize)> {
    let mut rest = message.strip_prefix(tag)?;
    let len = prost::encoding::decode_varint(&mut rest).ok()?;
    (len == rest.len() as u64).then_some((message.len() - rest.len(), rest.len()))
}

/// The payload length of a framed message when the message is one `data`
/// field and nothing else, so that it can pass as a `TcpForwardFrame` or a
/// `RelayFrame` alike. `None` for any other message, which is then decoded.
pub fn data_len(framed: &[u8]) -> Option<usize> {
    only_field(message_of(framed), &[DATA_TAG]).map(|(_, len)| len)
}

/// The key of `RelayFrame.exec_event` (field 21, length-delimited): 170
/// as a varint.
const EXEC_EVENT_TAG: [u8; 2] = [0xaa, 0x01];
/// The keys of `ExecSandboxEvent.stdout` (1) and `.stderr` (2).
const OUTPUT_TAGS: [u8; 2] = [(1 << 3) | 2, DATA_TAG];

/// The encoded `ExecSandboxEvent` inside a framed relay frame, when the
/// frame is one `exec_event` holding stdout or stderr (an exit or any other
/// encoding is `None`, and is decoded): the exec routes send it on without
/// decoding it.
pub fn exec_output(framed: &Bytes) -> Option<Bytes> {
    let message = message_of(framed);
    let (start, len) = only_field(message, &EXEC_EVENT_TAG)?;
    let event = &message[start..];
    OUTPUT_TAGS
        .iter()
        .any(|tag| only_field(event, &[*tag]).is_some())
        .then(|| {
            let offset = framed.len() - message.len() + start;
            framed.slice(offset..offset + len)
        })
}

/// Decodes a framed message; a malformed one fails as tonic's decoder fails
/// it (`INTERNAL`, which the routes answer as the sender's fault).
pub fn decode<M: prost::Message + Default>(framed: Bytes) -> Result<M, Status> {
    let start = PREFIX_LEN.min(framed.len());
    decode_message(framed.slice(start..))
}

/// Decodes a message without its prefix.
pub fn decode_message<M: prost::Message + Default>(message: Bytes) -> Result<M, Status> {
    M::decode(message).map_err(|err| Status::internal(err.to_string()))
}

/// A frame built here, encoded once behind its gRPC prefix.
pub fn framed(frame: &impl prost::Message) -> Outbound {
    Outbound::Framed(frame_message(frame))
}

#[cfg(test)]
mod tests {
    use super::*;
    use openshell_proto::{RelayEof, RelayFrame, TcpForwardFrame, relay_frame, tcp_forward_frame};
    use prost::Message;

    #[test]
    fn a_data_frame_is_the_same_bytes_in_both_messages() {
        for len in [0usize, 1, 127, 128, 70_000] {
            let data = Bytes::from(vec![5u8; len]);
            let forward = TcpForwardFrame {
                payload: Some(tcp_forward_frame::Payload::Data(data.clone())),
            }
            .encode_to_vec();
            let relay = RelayFrame {
                payload: Some(relay_frame::Payload::Data(data)),
            };
            assert_eq!(forward, relay.encode_to_vec());
            assert_eq!(data_len(&frame_message(&relay)), Some(len));
        }
    }

    #[test]
    fn other_frames_and_odd_encodings_are_decoded() {
        let eof = frame_message(&RelayFrame {
            payload: Some(relay_frame::Payload::Eof(RelayEof {})),
        });
        assert_eq!(data_len(&eof), None);
        assert_eq!(data_len(&[]), None);
        let framed = |message: &[u8]| [&[0, 0, 0, 0, message.len() as u8][..], message].concat();
        // A length that overruns the message, or bytes after the field.
        assert_eq!(data_len(&framed(&[DATA_TAG, 3, 1, 2])), None);
        assert_eq!(data_len(&framed(&[DATA_TAG, 1, 1, 8, 1])), None);
        assert_eq!(data_len(&framed(&[DATA_TAG, 1, 1])), Some(1));
        // A data field repeated: the last one counts, so decode it.
        let twice = framed(&[DATA_TAG, 1, 1, DATA_TAG, 1, 2]);
        assert_eq!(data_len(&twice), None);
        let decoded: RelayFrame = decode(Bytes::from(twice)).unwrap();
        assert_eq!(
            decoded.payload,
            Some(relay_frame::Payload::Data(Bytes::from_static(&[2])))
        );
        let bad = decode::<RelayFrame>(Bytes::from(framed(&[DATA_TAG, 9])));
        assert_eq!(bad.unwrap_err().code(), tonic::Code::Internal);
    }

    #[test]
    fn exec_output_is_found_inside_its_relay_frame() {
        use openshell_proto::{
            ExecSandboxEvent, ExecSandboxExit, ExecSandboxStderr, ExecSandboxStdout,
            exec_sandbox_event,
        };
        let relay = |payload| {
            frame_message(&RelayFrame {
                payload: Some(relay_frame::Payload::ExecEvent(ExecSandboxEvent {
                    payload: Some(payload),
                })),
            })
        };
        for len in [0usize, 5, 200, 70_000] {
            for payload in [
                exec_sandbox_event::Payload::Stdout(ExecSandboxStdout { data: vec![7; len] }),
                exec_sandbox_event::Payload::Stderr(ExecSandboxStderr { data: vec![8; len] }),
            ] {
                let event = ExecSandboxEvent {
                    payload: Some(payload.clone()),
                };
                let inner = exec_output(&relay(payload)).expect("output passes");
                assert_eq!(inner, event.encode_to_vec());
            }
        }
        let exit = relay(exec_sandbox_event::Payload::Exit(ExecSandboxExit {
            exit_code: 3,
            oom_killed: false,
        }));
        assert_eq!(exec_output(&exit), None);
        assert_eq!(exec_output(&frame_message(&RelayFrame::default())), None);
        // The key is what prost writes for field 21.
        let mut key = Vec::new();
        prost::encoding::encode_key(21, prost::encoding::WireType::LengthDelimited, &mut key);
        assert_eq!(key, EXEC_EVENT_TAG);
    }
}
