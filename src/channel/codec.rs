//! How a channel's messages become bytes: plain-old-data as itself, anything serde can
//! describe in the BARE message format.

use bytemuck::Pod;
use serde::de::DeserializeOwned;
use serde::Serialize;

use crate::error::{Error, Result};

/// How a channel turns `T` into bytes and back. Both ends of a channel must use the same one
/// (the handshake compares their [`ID`](Codec::ID)s).
///
/// ```
/// use barewire::{Bare, Codec};
/// #[derive(Debug, PartialEq, serde::Serialize, serde::Deserialize)]
/// struct Order { id: u64, item: String }
///
/// let mut bytes = Vec::new();
/// let order = Order { id: 7, item: "bolts".into() };
/// Bare::encode(&order, &mut bytes).unwrap();
/// assert_eq!(<Bare as Codec<Order>>::decode(&bytes).unwrap(), order);
/// // Bytes that do not decode are an error, never a panic.
/// assert!(<Bare as Codec<Order>>::decode(&[0xff; 3]).is_err());
/// ```
pub trait Codec<T> {
    /// Identifies the codec in the channel handshake (both sides must agree).
    const ID: u8;
    /// Appends the encoding of `item` to `out`.
    fn encode(item: &T, out: &mut Vec<u8>) -> Result<()>;
    /// Decodes one message.
    fn decode(bytes: &[u8]) -> Result<T>;
    /// The length of every encoded message, where the codec gives all of them one (`Raw`: the
    /// type's size). A sender then refuses any other length, and a receiver that watches its
    /// ring clears only a slot's length and mark words after taking a message, not the whole
    /// slot: the next message in that slot has the same length, so its mark lands on a cleared
    /// word, never on a stale one.
    const FIXED_LEN: Option<usize> = None;
    /// The encoding of `item` where it is `item`'s own bytes (no copy needed to send it).
    fn as_bytes(_item: &T) -> Option<&[u8]> {
        None
    }
    /// Decodes a `len`-byte message that `fill` copies out of the ring into the slice it is
    /// given (of exactly `len` bytes).
    fn decode_from(len: usize, fill: impl FnOnce(&mut [u8])) -> Result<T> {
        // Small messages are copied out onto the stack, larger ones into a fresh buffer.
        let mut small = [0u8; 256];
        let mut large = Vec::new();
        let bytes: &mut [u8] = if len <= small.len() {
            &mut small[..len]
        } else {
            large.resize(len, 0);
            &mut large
        };
        fill(bytes);
        Self::decode(bytes)
    }
    /// Decodes a `len`-byte message as `decode_from` does into `out`, which it initializes
    /// when it returns `Ok`: for [`Receiver::recv`](super::Receiver::recv), which returns the
    /// value from there, so that plain-old-data is copied out of the ring into the value the
    /// caller gets, with no `Result` around it to move on the way.
    fn decode_into(
        len: usize,
        fill: impl FnOnce(&mut [u8]),
        out: &mut std::mem::MaybeUninit<T>,
    ) -> Result<()> {
        out.write(Self::decode_from(len, fill)?);
        Ok(())
    }
    /// Decodes a `len`-byte message as `decode_from` does into `out`, replacing what it held:
    /// for [`Receiver::recv_into`](super::Receiver::recv_into), which fills a value the caller
    /// keeps from one message to the next. On an error `out` is left as it was. Plain-old-data
    /// is copied out of the ring straight into `out`, and [`Bytes`] reuses `out`'s allocation.
    fn decode_replace(len: usize, fill: impl FnOnce(&mut [u8]), out: &mut T) -> Result<()> {
        *out = Self::decode_from(len, fill)?;
        Ok(())
    }
    /// Decodes a `len`-byte message as `decode_from` does and appends it to `out`: for a
    /// receiver taking many at once ([`Receiver::recv_many`](super::Receiver::recv_many)),
    /// which plain-old-data fills in place, with no value moved through a `Result`.
    fn decode_push(len: usize, fill: impl FnOnce(&mut [u8]), out: &mut Vec<T>) -> Result<()> {
        out.push(Self::decode_from(len, fill)?);
        Ok(())
    }
}

/// Plain-old-data as its own bytes: no encoding step at all. What
/// [`Endpoint::open_channel`](crate::Endpoint::open_channel) uses.
///
/// ```
/// use barewire::{Codec, Raw};
/// let mut bytes = Vec::new();
/// Raw::encode(&[1u32, 2, 3], &mut bytes).unwrap();
/// assert_eq!(bytes.len(), 12); // the value's own bytes
/// assert_eq!(<Raw as Codec<[u32; 3]>>::FIXED_LEN, Some(12));
/// assert_eq!(<Raw as Codec<[u32; 3]>>::decode(&bytes).unwrap(), [1, 2, 3]);
/// assert!(<Raw as Codec<[u32; 3]>>::decode(&bytes[..8]).is_err()); // the wrong length
/// ```
pub struct Raw;

impl Raw {
    /// `Ok` when a `len`-byte message can be a `T` (it is exactly `T`'s size).
    #[inline(always)]
    fn fits<T>(len: usize) -> Result<()> {
        if len == std::mem::size_of::<T>() {
            Ok(())
        } else {
            Err(Raw::wrong_size::<T>(len))
        }
    }

    #[cold]
    fn wrong_size<T>(len: usize) -> Error {
        Error::Malformed(format!("{len} bytes for a {}", std::any::type_name::<T>()))
    }
}

impl<T: Pod> Codec<T> for Raw {
    const ID: u8 = 0;
    const FIXED_LEN: Option<usize> = Some(std::mem::size_of::<T>());
    fn encode(item: &T, out: &mut Vec<u8>) -> Result<()> {
        out.extend_from_slice(bytemuck::bytes_of(item));
        Ok(())
    }
    fn as_bytes(item: &T) -> Option<&[u8]> {
        Some(bytemuck::bytes_of(item))
    }
    fn decode_from(len: usize, fill: impl FnOnce(&mut [u8])) -> Result<T> {
        Raw::fits::<T>(len)?;
        // Straight into the value: one copy out of the ring.
        let mut v = T::zeroed();
        fill(bytemuck::bytes_of_mut(&mut v));
        Ok(v)
    }
    fn decode_into(
        len: usize,
        fill: impl FnOnce(&mut [u8]),
        out: &mut std::mem::MaybeUninit<T>,
    ) -> Result<()> {
        Raw::fits::<T>(len)?;
        // Straight into the value: one copy out of the ring.
        fill(bytemuck::bytes_of_mut(out.write(T::zeroed())));
        Ok(())
    }
    fn decode_replace(len: usize, fill: impl FnOnce(&mut [u8]), out: &mut T) -> Result<()> {
        Raw::fits::<T>(len)?;
        // Straight into the caller's value: one copy out of the ring.
        fill(bytemuck::bytes_of_mut(out));
        Ok(())
    }
    fn decode_push(len: usize, fill: impl FnOnce(&mut [u8]), out: &mut Vec<T>) -> Result<()> {
        Raw::fits::<T>(len)?;
        // Straight into the vector's new element: one copy out of the ring.
        out.push(T::zeroed());
        let last = out.last_mut().expect("just pushed");
        fill(bytemuck::bytes_of_mut(last));
        Ok(())
    }
    fn decode(bytes: &[u8]) -> Result<T> {
        bytemuck::try_pod_read_unaligned(bytes).map_err(|e| {
            Error::Malformed(format!(
                "{} bytes for a {}: {e}",
                bytes.len(),
                std::any::type_name::<T>()
            ))
        })
    }
}

/// The BARE message format (draft-devault-bare) through serde: for types that are not plain
/// old data. What [`Endpoint::open_bare_channel`](crate::Endpoint::open_bare_channel) uses.
///
/// ```
/// use barewire::{Bare, Codec};
/// let mut bytes = Vec::new();
/// Bare::encode(&(String::from("temp"), 21.5f32), &mut bytes).unwrap();
/// let back: (String, f32) = Bare::decode(&bytes).unwrap();
/// assert_eq!(back, ("temp".to_string(), 21.5));
/// ```
pub struct Bare;

impl<T: Serialize + DeserializeOwned> Codec<T> for Bare {
    const ID: u8 = 1;
    fn encode(item: &T, out: &mut Vec<u8>) -> Result<()> {
        serde_bare::to_writer(out, item).map_err(|e| Error::Invalid(format!("BARE encoding: {e}")))
    }
    fn decode(bytes: &[u8]) -> Result<T> {
        serde_bare::from_slice(bytes).map_err(|e| Error::Malformed(format!("BARE: {e}")))
    }
}

/// Opaque byte messages: a `Vec<u8>` travels as its bytes, for protocols that frame their own
/// contents (several small records per message, say). What
/// [`Endpoint::open_bytes_channel`](crate::Endpoint::open_bytes_channel) uses.
///
/// ```
/// use barewire::{Bytes, Codec};
/// let mut out = Vec::new();
/// Bytes::encode(&b"two\0records".to_vec(), &mut out).unwrap();
/// assert_eq!(out, b"two\0records");
/// ```
pub struct Bytes;

impl Codec<Vec<u8>> for Bytes {
    const ID: u8 = 2;
    fn encode(item: &Vec<u8>, out: &mut Vec<u8>) -> Result<()> {
        out.extend_from_slice(item);
        Ok(())
    }
    fn as_bytes(item: &Vec<u8>) -> Option<&[u8]> {
        Some(item)
    }
    fn decode_from(len: usize, fill: impl FnOnce(&mut [u8])) -> Result<Vec<u8>> {
        let mut v = vec![0u8; len];
        fill(&mut v);
        Ok(v)
    }
    fn decode_replace(len: usize, fill: impl FnOnce(&mut [u8]), out: &mut Vec<u8>) -> Result<()> {
        // Into the caller's vector, whose allocation serves message after message.
        out.clear();
        out.resize(len, 0);
        fill(out);
        Ok(())
    }
    fn decode(bytes: &[u8]) -> Result<Vec<u8>> {
        Ok(bytes.to_vec())
    }
}
