//! The arrays of a store and of an index's rows: built in memory, or read in place
//! from a mapped snapshot, so loading one copies nothing.
//!
//! A builder's columns append into a buffer that later stores share: a store is the
//! first `len` words of it, and the builder that resumes from that store (and only
//! one) appends past them, so an incremental refresh copies no unchanged data.

use super::blob::Word;
use crate::bounded_read::FileBytes;
use std::mem::ManuallyDrop;
use std::ops::Deref;
use std::ptr::NonNull;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;

/// Room left past a sealed or copied column of `len` words, for the next refreshes.
fn room_past(len: usize) -> usize {
    (len / 8).max(64)
}

/// A stored array whose length is not a whole number of its words: `bytes` bytes
/// of `width`-byte words in the array `name`.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct RaggedColumn {
    pub name: &'static str,
    pub bytes: usize,
    pub width: usize,
}

impl std::fmt::Display for RaggedColumn {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let RaggedColumn { name, bytes, width } = self;
        write!(f, "{name}: {bytes} bytes are not a whole number of {width}-byte words")
    }
}

impl std::error::Error for RaggedColumn {}

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
    /// The first `len` words of `buf` (at `ptr`, cached for reads); `tail`: this
    /// column alone may write past `len`.
    Shared {
        ptr: NonNull<T>,
        len: usize,
        buf: Arc<Buffer<T>>,
        tail: bool,
    },
}

/// Words that columns share a prefix of. Words below `filled` are never written
/// again; the one column holding `taken` writes past its own length only.
struct Buffer<T> {
    ptr: NonNull<T>,
    cap: usize,
    /// The length of the column that last held the tail.
    filled: AtomicUsize,
    taken: AtomicBool,
}

impl<T> Buffer<T> {
    /// A buffer of `words`, its tail taken by the column made of it.
    fn of(words: Vec<T>) -> (Buffer<T>, usize) {
        let mut words = ManuallyDrop::new(words);
        let (ptr, len, cap) = (words.as_mut_ptr(), words.len(), words.capacity());
        // SAFETY: a Vec's pointer is never null.
        let ptr = unsafe { NonNull::new_unchecked(ptr) };
        (Buffer { ptr, cap, filled: AtomicUsize::new(len), taken: AtomicBool::new(true) }, len)
    }

    /// The words as a `Vec` of `len`, to grow or shrink; only with the buffer to
    /// oneself, and given back by `Buffer::of`-like `restore`.
    ///
    /// # Safety
    /// No other column reads this buffer, and `len` words of it are written.
    unsafe fn take_vec(&mut self, len: usize) -> ManuallyDrop<Vec<T>> {
        ManuallyDrop::new(Vec::from_raw_parts(self.ptr.as_ptr(), len, self.cap))
    }

    fn restore(&mut self, words: ManuallyDrop<Vec<T>>) {
        let mut words = words;
        // SAFETY: a Vec's pointer is never null.
        self.ptr = unsafe { NonNull::new_unchecked(words.as_mut_ptr()) };
        self.cap = words.capacity();
    }
}

impl<T> Drop for Buffer<T> {
    fn drop(&mut self) {
        // SAFETY: the allocation of the Vec `of` took, length 0: `T: Word` is Copy.
        drop(unsafe { Vec::from_raw_parts(self.ptr.as_ptr(), 0, self.cap) });
    }
}

// SAFETY: a `File` column only reads immutable bytes kept alive by an `Arc` of a
// `Send + Sync` owner; a `Heap` column is a `Vec` of `Send + Sync` words; a `Shared`
// column reads words no column writes again and writes only where no other reads
// (past its length, holding the buffer's tail), the hand-over being atomic.
unsafe impl<T: Word + Send + Sync> Send for Column<T> {}
// SAFETY: as for Send.
unsafe impl<T: Word + Send + Sync> Sync for Column<T> {}

impl<T: Word> Column<T> {
    /// The words of `blob`, the little-endian array `name`: borrowed when `blob` lies
    /// in `file` and is aligned for `T` on a little-endian machine, else copied. An
    /// error, naming the array, when its length is not a whole number of words.
    pub fn from_blob(file: &Arc<FileBytes>, name: &'static str, blob: &[u8]) -> Result<Column<T>, RaggedColumn> {
        if !blob.len().is_multiple_of(T::WIDTH) {
            return Err(RaggedColumn { name, bytes: blob.len(), width: T::WIDTH });
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

    /// The words as a `Vec` to change; a column read from a file or sharing a
    /// buffer is copied first.
    pub fn make_mut(&mut self) -> &mut Vec<T> {
        if !matches!(self.0, Words::Heap(_)) {
            self.0 = Words::Heap(self.to_vec());
        }
        match &mut self.0 {
            Words::Heap(words) => words,
            _ => unreachable!("made a heap column above"),
        }
    }

    /// Bytes held: a heap column's capacity, or the words it reads (a file's, or a
    /// shared buffer's: its room to grow is untouched, not resident).
    pub fn heap_bytes(&self) -> usize {
        match &self.0 {
            Words::Heap(words) => words.capacity() * std::mem::size_of::<T>(),
            Words::File { len, .. } | Words::Shared { len, .. } => len * std::mem::size_of::<T>(),
        }
    }

    #[inline]
    pub fn push(&mut self, word: T) {
        self.room(1);
        if let Words::Shared { ptr, len, .. } = &mut self.0 {
            // SAFETY: `room` gave this column the tail and a word of room past `len`.
            unsafe { ptr.as_ptr().add(*len).write(word) };
            *len += 1;
        }
    }

    #[inline]
    pub fn extend_from_slice(&mut self, words: &[T]) {
        self.room(words.len());
        if let Words::Shared { ptr, len, .. } = &mut self.0 {
            // SAFETY: `room` gave this column the tail and `words.len()` words of room
            // past `len`; `words` cannot lie there (nothing reads past `len`).
            unsafe { ptr.as_ptr().add(*len).copy_from_nonoverlapping(words.as_ptr(), words.len()) };
            *len += words.len();
        }
    }

    /// Empties the column, keeping its buffer when it is this column's alone (words
    /// are `Copy`: nothing to drop), else leaving any shared words to their sharers.
    pub fn clear(&mut self) {
        match &mut self.0 {
            Words::Heap(words) => words.clear(),
            Words::Shared { len, buf, tail: true, .. } if Arc::strong_count(buf) == 1 => *len = 0,
            _ => *self = Column::default(),
        }
    }

    /// Room for `additional` more words without another allocation.
    pub fn reserve(&mut self, additional: usize) {
        self.room(additional);
    }

    /// Gives up the right to append (the next builder resuming from this length
    /// takes it), leaving the buffer [`room_past`] longer when it is this column's alone:
    /// room for incremental refreshes to append without copying.
    pub fn seal(&mut self) {
        let Words::Shared { ptr, len, buf, tail } = &mut self.0 else { return };
        if !*tail {
            return;
        }
        if let Some(own) = Arc::get_mut(buf) {
            let room = *len + room_past(*len);
            if own.cap > room {
                // SAFETY: the buffer is this column's alone and `len` words are written.
                let mut words = unsafe { own.take_vec(*len) };
                words.shrink_to(room);
                own.restore(words);
                *ptr = own.ptr;
            }
        }
        buf.filled.store(*len, Ordering::Release);
        buf.taken.store(false, Ordering::Release);
        *tail = false;
    }

    #[inline]
    fn room(&mut self, additional: usize) {
        if let Words::Shared { len, buf, tail: true, .. } = &self.0 {
            if buf.cap - *len >= additional {
                return;
            }
        }
        self.make_room(additional);
    }

    /// Takes the tail of a shared buffer this column ends at, grows a buffer of its
    /// own, or copies the words into a new one.
    #[cold]
    fn make_room(&mut self, additional: usize) {
        if let Words::Shared { ptr, len, buf, tail } = &mut self.0 {
            if !*tail && buf.filled.load(Ordering::Acquire) == *len && !buf.taken.swap(true, Ordering::AcqRel) {
                // Taken; still ours only if no other column appended in between.
                *tail = buf.filled.load(Ordering::Acquire) == *len;
                if !*tail {
                    buf.taken.store(false, Ordering::Release);
                }
            }
            if *tail && buf.cap - *len >= additional {
                return;
            }
            if let (true, Some(own)) = (*tail, Arc::get_mut(buf)) {
                // SAFETY: the buffer is this column's alone and `len` words are written.
                let mut words = unsafe { own.take_vec(*len) };
                words.reserve(additional);
                own.restore(words);
                *ptr = own.ptr;
                return;
            }
        }
        let mut words = Vec::with_capacity(self.len() + room_past(self.len()).max(additional));
        words.extend_from_slice(self);
        let (buf, len) = Buffer::of(words);
        // The old column gives its tail back when dropped here.
        self.0 = Words::Shared { ptr: buf.ptr, len, buf: Arc::new(buf), tail: true };
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
            // SAFETY: the first `len` words of `buf` are written and never written
            // again (only past the length of the column holding the tail); `buf`
            // lives as long as this column and `ptr` is its pointer.
            Words::Shared { ptr, len, .. } => unsafe { std::slice::from_raw_parts(ptr.as_ptr(), *len) },
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
            Words::Shared { ptr, len, buf, .. } => {
                Column(Words::Shared { ptr: *ptr, len: *len, buf: Arc::clone(buf), tail: false })
            }
        }
    }
}

impl<T> Drop for Words<T> {
    /// A column holding a buffer's tail gives it back at its length.
    fn drop(&mut self) {
        if let Words::Shared { len, buf, tail: true, .. } = self {
            buf.filled.store(*len, Ordering::Release);
            buf.taken.store(false, Ordering::Release);
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
        assert_eq!(error, RaggedColumn { name: "t", bytes: 3, width: 4 });
        assert_eq!(error.to_string(), "t: 3 bytes are not a whole number of 4-byte words");
        let mut copy = in_place.clone();
        copy.make_mut().push(3);
        assert_eq!(*copy, [1, 2, u32::MAX, 3]);
        assert!(!copy.is_mapped());
        assert_eq!(*in_place, [1, 2, u32::MAX], "the original is unchanged");
        assert_eq!(in_place, Column::from(vec![1, 2, u32::MAX]));
        let longs = Column::<i64>::from_blob(&file, "t", &file[8..16]).unwrap();
        assert_eq!(*longs, [i64::from_le_bytes([2, 0, 0, 0, 0xff, 0xff, 0xff, 0xff])]);
    }

    #[test]
    fn a_resumed_column_appends_past_the_words_it_shares_and_only_one_may() {
        let mut built = Column::<u32>::default();
        built.extend_from_slice(&[1, 2, 3]);
        built.push(4);
        built.seal();
        let base = built.as_ptr();
        let mut resumed = built.clone();
        resumed.push(5);
        assert_eq!(resumed.as_ptr(), base, "the four words are shared, not copied");
        assert_eq!(*resumed, [1, 2, 3, 4, 5]);
        assert_eq!(*built, [1, 2, 3, 4], "the column resumed from is unchanged");
        // Another column ending at 4 cannot write where `resumed` did: it copies.
        let mut branch = built.clone();
        branch.push(6);
        assert_ne!(branch.as_ptr(), base);
        assert_eq!((&*branch, &*resumed, &*built), (&[1, 2, 3, 4, 6][..], &[1, 2, 3, 4, 5][..], &[1, 2, 3, 4][..]));
        // Sealed, the longer column hands its tail on to the next one.
        resumed.seal();
        let mut next = resumed.clone();
        next.extend_from_slice(&[7; 10]);
        assert_eq!(next.as_ptr(), base);
        assert_eq!(next.len(), 15);
        assert_eq!(*resumed, [1, 2, 3, 4, 5]);
        drop(next);
        // Dropped unsealed, a column gives its tail back at its length: no column
        // resumed from `resumed` writes over what it wrote while others may read it.
        let mut after_drop = resumed.clone();
        after_drop.push(8);
        assert_eq!(*after_drop, [1, 2, 3, 4, 5, 8]);
        assert_ne!(after_drop.as_ptr(), base);
    }

    #[test]
    fn a_cleared_column_keeps_its_own_buffer_and_leaves_a_shared_one_to_its_sharers() {
        let mut own: Column<u32> = Column::default();
        own.extend_from_slice(&[1, 2, 3]);
        let buffer = own.as_ptr();
        own.clear();
        assert!(own.is_empty());
        own.push(4);
        assert_eq!((own.as_ptr(), &*own), (buffer, &[4][..]));
        let sharer = own.clone();
        own.clear();
        own.push(5);
        assert_eq!((&*sharer, &*own), (&[4][..], &[5][..]));
        assert_ne!(own.as_ptr(), buffer);
    }
}
