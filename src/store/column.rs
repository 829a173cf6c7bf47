//! The arrays of a store and of an index's rows: built in memory, or read in place
//! from a mapped snapshot, so loading one copies nothing.

use super::blob::Word;
use crate::bounded_read::FileBytes;
use std::ops::Deref;
use std::ptr::NonNull;
use std::sync::Arc;

/// A read-only array of words that dereferences to a slice. [`Column::make_mut`]
/// gives a `Vec` to change (copying a borrowed column first).
pub struct Column<T: Word>(Words<T>);

enum Words<T> {
    Heap(Vec<T>),
    /// `len` words at `ptr`, inside `file`, which keeps them alive.
    File {
        ptr: NonNull<T>,
        len: usize,
        file: Arc<FileBytes>,
    },
}

// SAFETY: a `File` column only reads immutable bytes kept alive by an `Arc` of a
// `Send + Sync` owner; a `Heap` column is a `Vec` of `Send + Sync` words.
unsafe impl<T: Word + Send + Sync> Send for Column<T> {}
// SAFETY: as for Send.
unsafe impl<T: Word + Send + Sync> Sync for Column<T> {}

impl<T: Word> Column<T> {
    /// The words of `blob`, the little-endian array `name`: borrowed when `blob` lies
    /// in `file` and is aligned for `T` on a little-endian machine, else copied. An
    /// error, naming the array, when its length is not a whole number of words.
    pub fn from_blob(file: &Arc<FileBytes>, name: &str, blob: &[u8]) -> Result<Column<T>, String> {
        if !blob.len().is_multiple_of(T::WIDTH) {
            let len = blob.len();
            return Err(format!("{name}: {len} bytes are not a whole number of {}-byte words", T::WIDTH));
        }
        let len = blob.len() / T::WIDTH;
        let inside = file.as_ptr_range().start <= blob.as_ptr() && blob.as_ptr_range().end <= file.as_ptr_range().end;
        let aligned = (blob.as_ptr() as usize).is_multiple_of(std::mem::align_of::<T>());
        if cfg!(target_endian = "little") && inside && aligned && std::mem::size_of::<T>() == T::WIDTH {
            if let Some(ptr) = NonNull::new(blob.as_ptr().cast_mut().cast::<T>()) {
                return Ok(Column(Words::File { ptr, len, file: Arc::clone(file) }));
            }
        }
        Ok(Column(Words::Heap(blob.chunks_exact(T::WIDTH).map(T::get).collect())))
    }

    /// The words as a `Vec` to change; a column read from a file is copied first.
    pub fn make_mut(&mut self) -> &mut Vec<T> {
        if let Words::File { .. } = self.0 {
            self.0 = Words::Heap(self.to_vec());
        }
        match &mut self.0 {
            Words::Heap(words) => words,
            Words::File { .. } => unreachable!("made a heap column above"),
        }
    }

    /// Bytes held: a heap column's capacity, or the file bytes it reads.
    pub fn heap_bytes(&self) -> usize {
        match &self.0 {
            Words::Heap(words) => words.capacity() * std::mem::size_of::<T>(),
            Words::File { len, .. } => len * std::mem::size_of::<T>(),
        }
    }

    /// Whether the words are read in place from a file.
    pub fn is_mapped(&self) -> bool {
        matches!(self.0, Words::File { .. })
    }
}

impl<T: Word> Deref for Column<T> {
    type Target = [T];

    #[inline]
    fn deref(&self) -> &[T] {
        match &self.0 {
            Words::Heap(words) => words,
            // SAFETY: `from_blob` checked that the `len` words at `ptr` lie inside
            // `file`, aligned for `T`; `T: Word` accepts any bit pattern; `file` is
            // never written and lives as long as this column.
            Words::File { ptr, len, .. } => unsafe { std::slice::from_raw_parts(ptr.as_ptr(), *len) },
        }
    }
}

impl<T: Word> From<Vec<T>> for Column<T> {
    fn from(words: Vec<T>) -> Column<T> {
        Column(Words::Heap(words))
    }
}

impl<T: Word> Default for Column<T> {
    fn default() -> Column<T> {
        Column(Words::Heap(Vec::new()))
    }
}

impl<T: Word> Clone for Column<T> {
    fn clone(&self) -> Column<T> {
        match &self.0 {
            Words::Heap(words) => Column(Words::Heap(words.clone())),
            Words::File { ptr, len, file } => Column(Words::File { ptr: *ptr, len: *len, file: Arc::clone(file) }),
        }
    }
}

impl<T: Word + PartialEq> PartialEq for Column<T> {
    fn eq(&self, other: &Column<T>) -> bool {
        **self == **other
    }
}

impl<T: Word + std::fmt::Debug> std::fmt::Debug for Column<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_list().entries(self.iter()).finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_aligned_blob_inside_the_file_is_read_in_place_anything_else_is_copied() {
        let mut bytes = vec![0u8; 4];
        bytes.extend([1, 0, 0, 0, 2, 0, 0, 0, 0xff, 0xff, 0xff, 0xff]);
        let file = Arc::new(FileBytes::from(bytes));
        let start = file.as_ptr() as usize;
        // A heap Vec is at least 8-aligned here; offset 4 then is 4-aligned.
        assert!(start.is_multiple_of(8));
        let in_place = Column::<u32>::from_blob(&file, "t", &file[4..16]).unwrap();
        assert_eq!(*in_place, [1, 2, u32::MAX]);
        assert_eq!(in_place.is_mapped(), cfg!(target_endian = "little"));
        let unaligned = Column::<u32>::from_blob(&file, "t", &file[5..9]).unwrap();
        assert_eq!(*unaligned, [0x0200_0000]);
        assert!(!unaligned.is_mapped());
        let elsewhere = [7u8, 0, 0, 0];
        assert!(!Column::<u32>::from_blob(&file, "t", &elsewhere).unwrap().is_mapped());
        let error = Column::<u32>::from_blob(&file, "t", &file[4..7]).unwrap_err();
        assert_eq!(error, "t: 3 bytes are not a whole number of 4-byte words");
        let mut copy = in_place.clone();
        copy.make_mut().push(3);
        assert_eq!(*copy, [1, 2, u32::MAX, 3]);
        assert!(!copy.is_mapped());
        assert_eq!(*in_place, [1, 2, u32::MAX], "the original is unchanged");
        assert_eq!(in_place, Column::from(vec![1, 2, u32::MAX]));
        let longs = Column::<i64>::from_blob(&file, "t", &file[8..16]).unwrap();
        assert_eq!(*longs, [i64::from_le_bytes([2, 0, 0, 0, 0xff, 0xff, 0xff, 0xff])]);
    }
}
