//! Weight conversion at load: the Q4_1 tensors of the GGUF file become f32
//! (or Q8_0) while candle's quantized llama loader reads them.
//!
//! candle's loader reads tensors from a `Read + Seek` GGUF stream and keeps
//! each tensor in the dtype it finds. [`ConvertingReader`] is such a stream,
//! made up: a GGUF header (the llama metadata, tensor infos with the
//! *converted* dtypes and sizes) followed by tensor data that is produced one
//! tensor at a time, when the loader seeks to it, from the original file.
//! So the converted model never exists twice in memory: the peak is the
//! loaded weights plus one converted tensor.
//!
//! This module must not know the model architecture beyond what the loader
//! asks for; it converts whatever tensors the file holds.

use std::io::{Read, Seek, SeekFrom};

use candle_core::quantized::{GgmlDType, QTensor, gguf_file};
use candle_core::{Device, Result};
use candle_transformers::models::quantized_llama::ModelWeights;

/// GGUF data alignment (the default; the header sets no other).
const ALIGN: u64 = 32;

/// Load `ct` (read through `src`) with every matrix converted to `target`.
pub(crate) fn load_converted<R: Read + Seek>(
    ct: &gguf_file::Content,
    src: &mut R,
    target: GgmlDType,
) -> Result<ModelWeights> {
    let mut reader = ConvertingReader::new(ct, src, target)?;
    let converted = gguf_file::Content::read(&mut reader)?;
    ModelWeights::from_gguf(converted, &mut reader, &Device::Cpu)
}

fn dtype_code(d: GgmlDType) -> u32 {
    match d {
        GgmlDType::F32 => 0,
        GgmlDType::F16 => 1,
        GgmlDType::Q4_0 => 2,
        GgmlDType::Q4_1 => 3,
        GgmlDType::Q5_0 => 6,
        GgmlDType::Q5_1 => 7,
        GgmlDType::Q8_0 => 8,
        GgmlDType::Q8_1 => 9,
        GgmlDType::Q2K => 10,
        GgmlDType::Q3K => 11,
        GgmlDType::Q4K => 12,
        GgmlDType::Q5K => 13,
        GgmlDType::Q6K => 14,
        GgmlDType::Q8K => 15,
        GgmlDType::BF16 => 30,
    }
}

fn put_str(out: &mut Vec<u8>, s: &str) {
    out.extend_from_slice(&(s.len() as u64).to_le_bytes());
    out.extend_from_slice(s.as_bytes());
}

/// Write one scalar metadata value with its type code; arrays are skipped
/// (the llama loader reads none).
fn put_value(out: &mut Vec<u8>, key: &str, v: &gguf_file::Value) -> bool {
    use gguf_file::Value as V;
    let (code, bytes): (u32, Vec<u8>) = match v {
        V::U8(x) => (0, vec![*x]),
        V::I8(x) => (1, x.to_le_bytes().to_vec()),
        V::U16(x) => (2, x.to_le_bytes().to_vec()),
        V::I16(x) => (3, x.to_le_bytes().to_vec()),
        V::U32(x) => (4, x.to_le_bytes().to_vec()),
        V::I32(x) => (5, x.to_le_bytes().to_vec()),
        V::F32(x) => (6, x.to_le_bytes().to_vec()),
        V::Bool(x) => (7, vec![u8::from(*x)]),
        V::String(s) => {
            let mut b = Vec::new();
            put_str(&mut b, s);
            (8, b)
        }
        V::U64(x) => (10, x.to_le_bytes().to_vec()),
        V::I64(x) => (11, x.to_le_bytes().to_vec()),
        V::F64(x) => (12, x.to_le_bytes().to_vec()),
        V::Array(_) => return false,
    };
    put_str(out, key);
    out.extend_from_slice(&code.to_le_bytes());
    out.extend_from_slice(&bytes);
    true
}

struct Slot {
    name: String,
    /// Offset from the start of the data section.
    offset: u64,
    size: u64,
    /// Convert to the target dtype (else copy as stored).
    convert: bool,
}

/// A virtual GGUF file whose tensors are converted on demand.
struct ConvertingReader<'a, R> {
    header: Vec<u8>,
    data_start: u64,
    len: u64,
    pos: u64,
    slots: Vec<Slot>,
    ct: &'a gguf_file::Content,
    src: &'a mut R,
    target: GgmlDType,
    /// The converted bytes of one slot.
    current: Option<(usize, Vec<u8>)>,
}

impl<'a, R: Read + Seek> ConvertingReader<'a, R> {
    fn new(ct: &'a gguf_file::Content, src: &'a mut R, target: GgmlDType) -> Result<Self> {
        let mut names: Vec<&String> = ct.tensor_infos.keys().collect();
        names.sort();
        let mut meta = Vec::new();
        let mut n_kv = 0u64;
        let mut keys: Vec<&String> = ct.metadata.keys().collect();
        keys.sort();
        for key in keys {
            if (key.starts_with("llama.") || key == "general.architecture")
                && let Some(v) = ct.metadata.get(key)
                && put_value(&mut meta, key, v)
            {
                n_kv += 1;
            }
        }
        let mut infos = Vec::new();
        let mut slots = Vec::new();
        let mut offset = 0u64;
        for name in names {
            let Some(info) = ct.tensor_infos.get(name) else { continue };
            let dims = info.shape.dims();
            let keep = info.ggml_dtype == GgmlDType::F32 || dims.len() < 2 || info.ggml_dtype == target;
            let dtype = if keep { info.ggml_dtype } else { target };
            let elems = info.shape.elem_count();
            if !elems.is_multiple_of(dtype.block_size()) {
                candle_core::bail!("tensor {name} ({elems} values) does not fit {dtype:?} blocks");
            }
            let size = (elems / dtype.block_size() * dtype.type_size()) as u64;
            put_str(&mut infos, name);
            infos.extend_from_slice(&(dims.len() as u32).to_le_bytes());
            for &d in dims.iter().rev() {
                infos.extend_from_slice(&(d as u64).to_le_bytes());
            }
            infos.extend_from_slice(&dtype_code(dtype).to_le_bytes());
            infos.extend_from_slice(&offset.to_le_bytes());
            slots.push(Slot { name: name.clone(), offset, size, convert: !keep });
            offset += size.div_ceil(ALIGN) * ALIGN;
        }
        let mut header = Vec::new();
        header.extend_from_slice(&0x4655_4747u32.to_le_bytes());
        header.extend_from_slice(&2u32.to_le_bytes());
        header.extend_from_slice(&(slots.len() as u64).to_le_bytes());
        header.extend_from_slice(&n_kv.to_le_bytes());
        header.extend_from_slice(&meta);
        header.extend_from_slice(&infos);
        let data_start = (header.len() as u64).div_ceil(ALIGN) * ALIGN;
        header.resize(data_start as usize, 0);
        Ok(Self { header, data_start, len: data_start + offset, pos: 0, slots, ct, src, target, current: None })
    }

    /// Make `current` hold slot `i`'s bytes.
    fn load_slot(&mut self, i: usize) -> std::io::Result<()> {
        if self.current.as_ref().is_some_and(|(j, _)| *j == i) {
            return Ok(());
        }
        self.current = None;
        let Some(slot) = self.slots.get(i) else { return Ok(()) };
        let bytes = (|| -> Result<Vec<u8>> {
            let q = self.ct.tensor(self.src, &slot.name, &Device::Cpu)?;
            let q = if slot.convert { QTensor::quantize(&q.dequantize(&Device::Cpu)?, self.target)? } else { q };
            Ok(q.data()?.into_owned())
        })()
        .map_err(std::io::Error::other)?;
        self.current = Some((i, bytes));
        Ok(())
    }
}

impl<R: Read + Seek> Read for ConvertingReader<'_, R> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        if self.pos >= self.len || buf.is_empty() {
            return Ok(0);
        }
        if self.pos < self.data_start {
            let from = self.header.get(self.pos as usize..).unwrap_or_default();
            let n = from.len().min(buf.len());
            buf[..n].copy_from_slice(&from[..n]);
            self.pos += n as u64;
            return Ok(n);
        }
        let rel = self.pos - self.data_start;
        // The slot holding `rel`, or the padding after it.
        let i = self.slots.partition_point(|s| s.offset <= rel).saturating_sub(1);
        let Some(slot) = self.slots.get(i) else { return Ok(0) };
        let (start, size) = (slot.offset, slot.size);
        if rel >= start + size {
            // Alignment padding: zeros up to the next slot.
            let end = self.slots.get(i + 1).map_or(self.len - self.data_start, |s| s.offset);
            let n = ((end - rel) as usize).min(buf.len());
            buf[..n].fill(0);
            self.pos += n as u64;
            return Ok(n);
        }
        self.load_slot(i)?;
        let Some((_, bytes)) = &self.current else { return Ok(0) };
        let from = bytes.get((rel - start) as usize..).unwrap_or_default();
        let n = from.len().min(buf.len());
        buf[..n].copy_from_slice(&from[..n]);
        self.pos += n as u64;
        Ok(n)
    }
}

impl<R: Read + Seek> Seek for ConvertingReader<'_, R> {
    fn seek(&mut self, pos: SeekFrom) -> std::io::Result<u64> {
        let new = match pos {
            SeekFrom::Start(p) => Some(p),
            SeekFrom::End(d) => self.len.checked_add_signed(d),
            SeekFrom::Current(d) => self.pos.checked_add_signed(d),
        };
        let new = new.ok_or_else(|| std::io::Error::new(std::io::ErrorKind::InvalidInput, "seek out of range"))?;
        self.pos = new;
        Ok(new)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use candle_core::Tensor;
    use std::io::Cursor;

    /// A small GGUF with a Q4_1 matrix, an odd-sized f32 vector (so padding
    /// is exercised) and some metadata, read back through the converter.
    #[test]
    fn converted_stream_is_a_gguf_with_the_same_values() {
        let dev = Device::Cpu;
        let values: Vec<f32> = (0..64 * 32).map(|i| ((i % 37) as f32 - 18.0) / 7.0).collect();
        let matrix = Tensor::from_vec(values, (64, 32), &dev).unwrap();
        let q = QTensor::quantize(&matrix, GgmlDType::Q4_1).unwrap();
        let norm = QTensor::quantize(&Tensor::from_vec(vec![0.5f32; 5], 5, &dev).unwrap(), GgmlDType::F32).unwrap();
        let arch = gguf_file::Value::String("llama".into());
        let heads = gguf_file::Value::U32(9);
        let eps = gguf_file::Value::F32(1e-5);
        let other = gguf_file::Value::String("ignored".into());
        let mut file = Cursor::new(Vec::new());
        gguf_file::write(
            &mut file,
            &[
                ("general.architecture", &arch),
                ("llama.attention.head_count", &heads),
                ("llama.eps", &eps),
                ("x.y", &other),
            ],
            &[("blk.0.w", &q), ("norm", &norm)],
        )
        .unwrap();
        file.set_position(0);
        let ct = gguf_file::Content::read(&mut file).unwrap();
        for target in [GgmlDType::F32, GgmlDType::Q8_0] {
            let mut reader = ConvertingReader::new(&ct, &mut file, target).unwrap();
            let converted = gguf_file::Content::read(&mut reader).unwrap();
            assert_eq!(converted.metadata.len(), 3, "only llama.* and the architecture are carried");
            assert_eq!(converted.metadata["llama.attention.head_count"].to_u32().unwrap(), 9);
            let w = converted.tensor(&mut reader, "blk.0.w", &dev).unwrap();
            assert_eq!(w.dtype(), target);
            assert_eq!(w.shape().dims(), &[64, 32]);
            let n = converted.tensor(&mut reader, "norm", &dev).unwrap();
            assert_eq!(n.dtype(), GgmlDType::F32);
            let got: Vec<f32> = n.dequantize(&dev).unwrap().to_vec1().unwrap();
            assert_eq!(got, vec![0.5; 5]);
            let want: Vec<Vec<f32>> = q.dequantize(&dev).unwrap().to_vec2().unwrap();
            let have: Vec<Vec<f32>> = w.dequantize(&dev).unwrap().to_vec2().unwrap();
            for (a, b) in want.iter().flatten().zip(have.iter().flatten()) {
                let tol = if target == GgmlDType::F32 { 0.0 } else { 0.03 };
                assert!((a - b).abs() <= tol, "{target:?}: {a} vs {b}");
            }
        }
    }
}
