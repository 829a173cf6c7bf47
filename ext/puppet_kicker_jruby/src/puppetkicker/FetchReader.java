package puppetkicker;

import java.math.BigInteger;
import java.nio.charset.StandardCharsets;
import java.util.Arrays;
import java.util.HashMap;
import java.util.Map;
import org.jcodings.specific.UTF8Encoding;
import org.jruby.Ruby;
import org.jruby.RubyArray;
import org.jruby.RubyBignum;
import org.jruby.RubyClass;
import org.jruby.RubyFixnum;
import org.jruby.RubyFloat;
import org.jruby.RubyHash;
import org.jruby.RubyHash.RubyHashEntry;
import org.jruby.RubyModule;
import org.jruby.RubyObject;
import org.jruby.RubyString;
import org.jruby.anno.JRubyMethod;
import org.jruby.exceptions.RaiseException;
import org.jruby.ext.ffi.AbstractMemory;
import org.jruby.ext.ffi.MemoryIO;
import org.jruby.runtime.ObjectAllocator;
import org.jruby.runtime.ThreadContext;
import org.jruby.runtime.builtin.IRubyObject;
import org.jruby.util.ByteList;

/**
 * Reads an OK {@code pk_fetch} reply (layout: ext/puppet_kicker_ffi/src/fetch.rs) into
 * the caller's table of objects, as lib/puppet_kicker/fetch_reader.rb does, object for
 * object, but in Java: under JRuby that Ruby code costs more per object than JRuby
 * itself takes to build the object (a Hash through {@code Hash[*values_at(...)]} is
 * four Arrays and a splat). The reply is read where pk_fetch wrote it, through its FFI
 * pointer. Strings are slices of one copy of the reply's text, the other scalars come
 * from its JSON array, each Hash or Array from objects already in the table; all
 * frozen. Every count and number is checked against the reply's length, which
 * pk_fetch hands over beside it (no byte past it is read), and the table's size: a
 * malformed reply raises {@code PuppetKicker::Error}.
 *
 * <p>Loaded by lib/puppet_kicker/ffi_backend.rb under JRuby, from
 * native/puppet_kicker_jruby.jar, which {@code rake jar} builds. Java 11 bytecode,
 * JRuby 9.3 and 9.4 API.
 */
public final class FetchReader {
    /** The reply's header: u64 length, then nine u32. */
    static final int HEADER_BYTES = 44;
    static final int OK = 0;
    static final int OBJECT = 2;
    static final int ARRAY = 1;

    private FetchReader() {}

    /**
     * Defines {@code PuppetKicker::JavaFetchReader.servers(reply, length, table)} and
     * {@code .table}, and the class of its tables, {@code PuppetKicker::JavaFetchReader::Table}.
     */
    public static void define(Ruby runtime) {
        RubyModule kicker = runtime.defineModule("PuppetKicker");
        RubyModule reader = kicker.defineModuleUnder("JavaFetchReader");
        reader.defineAnnotatedMethods(FetchReader.class);
        RubyClass table = reader.defineClassUnder("Table", runtime.getObject(),
                ObjectAllocator.NOT_ALLOCATABLE_ALLOCATOR);
        table.defineAnnotatedMethods(Table.class);
    }

    /** A new, empty table, for a new index generation. */
    @JRubyMethod(name = "table", meta = true)
    public static IRubyObject table(ThreadContext context, IRubyObject self) {
        Ruby runtime = context.runtime;
        RubyModule type = runtime.getClassFromPath("PuppetKicker::JavaFetchReader::Table");
        if (!(type instanceof RubyClass)) {
            throw malformed(runtime, "PuppetKicker::JavaFetchReader::Table is not a class");
        }
        return new Table(runtime, (RubyClass) type);
    }

    /**
     * The servers' frozen Hashes, in the order asked, of {@code reply} (an FFI pointer
     * to the reply, its status OK: read where pk_fetch wrote it, not copied) of
     * {@code length} bytes (what pk_fetch said: no byte past them is read), their
     * objects appended to {@code table} (made by {@link #table}).
     */
    @JRubyMethod(name = "servers", meta = true)
    public static IRubyObject servers(ThreadContext context, IRubyObject self, IRubyObject reply, IRubyObject length,
            IRubyObject table) {
        Ruby runtime = context.runtime;
        if (!(reply instanceof AbstractMemory) || !(length instanceof RubyFixnum) || !(table instanceof Table)) {
            throw malformed(runtime,
                    "servers takes an FFI pointer to the reply, its length and a JavaFetchReader.table");
        }
        AbstractMemory memory = (AbstractMemory) reply;
        Table objects = (Table) table;
        // The reply's own length, as pk_fetch handed it over; never more than the
        // pointer's size when it has one (a pointer a function returned has none).
        long readable = Math.min(((RubyFixnum) length).getLongValue(), memory.getSize());
        synchronized (objects) {
            boolean read = false;
            try {
                IRubyObject servers = new Reading(context, memory.getMemoryIO(), readable, objects).servers();
                read = true;
                return servers;
            } finally {
                // After a reply not read to the end, the table holds nothing, so the
                // next fetch starts the session over, and no template is kept whose
                // key numbers a later reply gives to other objects.
                if (!read) {
                    objects.clear();
                }
            }
        }
    }

    /**
     * What a caller holds of one session: the objects of the replies it read, numbered
     * 0, 1, 2, ... as they came, and the Hashes to copy, by their keys' numbers. A Ruby
     * object ({@code size} is the {@code have} of the next fetch); its contents only
     * Java touches.
     */
    public static final class Table extends RubyObject {
        private static final long serialVersionUID = 1L;
        // Transient: a table is never serialized (RubyObject is Serializable).
        transient IRubyObject[] objects = new IRubyObject[64];
        transient int size;
        final transient Map<Keys, Template> templates = new HashMap<>();
        /** Templates last used, by their keys' count and first and last numbers ({@link FetchReader#slot}). */
        transient Template[] recent = new Template[RECENT];

        Table(Ruby runtime, RubyClass type) {
            super(runtime, type);
        }

        /** How many objects it holds. */
        @JRubyMethod(name = "size")
        public IRubyObject size(ThreadContext context) {
            return context.runtime.newFixnum(size);
        }

        /** Room for {@code more} objects. */
        void reserve(long more) {
            long needed = size + more;
            if (needed > objects.length) {
                objects = Arrays.copyOf(objects, (int) Math.min(Integer.MAX_VALUE - 8, Math.max(needed, 2L * objects.length)));
            }
        }

        void clear() {
            recent = new Template[RECENT];
            objects = new IRubyObject[64];
            size = 0;
            templates.clear();
        }
    }

    /**
     * A sequence of key numbers. A kept one owns its array; the probe a reply looks
     * templates up with is its scratch array's first {@code length} numbers.
     */
    static final class Keys {
        int[] numbers;
        int length;
        int hash;

        Keys(int[] numbers, int length) {
            set(numbers, length);
        }

        void set(int[] numbers, int length) {
            this.numbers = numbers;
            this.length = length;
            int h = 1;
            for (int i = 0; i < length; i++) {
                h = 31 * h + numbers[i];
            }
            this.hash = h;
        }

        Keys kept() {
            return new Keys(Arrays.copyOf(numbers, length), length);
        }

        @Override
        public int hashCode() {
            return hash;
        }

        @Override
        public boolean equals(Object other) {
            if (!(other instanceof Keys)) {
                return false;
            }
            Keys keys = (Keys) other;
            return keys.length == length && Arrays.equals(numbers, 0, length, keys.numbers, 0, keys.length);
        }
    }

    /**
     * The Hash that Hashes with one sequence of keys are copied from: never handed out,
     * its entries (in the keys' order) set to each new Hash's values before the copy.
     * Its keys are a table's objects, each once: the table and its templates are
     * cleared together.
     */
    static final class Template {
        private final Keys keys;
        private final RubyHash hash;
        private final RubyHashEntry[] entries;

        private Template(Keys keys, RubyHash hash, RubyHashEntry[] entries) {
            this.keys = keys;
            this.hash = hash;
            this.entries = entries;
        }

        /**
         * The template of {@code hash}, made of {@code keys} (kept), distinct; null if
         * it has fewer (a key twice) or none.
         */
        static Template of(Keys keys, RubyHash hash) {
            if (hash.size() != keys.length || keys.length == 0) {
                return null;
            }
            RubyHashEntry[] entries = new RubyHashEntry[keys.length];
            int at = 0;
            for (Object entry : hash.directEntrySet()) {
                entries[at++] = (RubyHashEntry) entry;
            }
            return new Template(keys, hash, entries);
        }

        /** Whether its keys are the first {@code count} of {@code numbers}. */
        boolean hasKeys(int[] numbers, int count) {
            return keys.length == count && Arrays.equals(keys.numbers, 0, count, numbers, 0, count);
        }
    }

    /** Slots of {@link Table#recent}: a power of two. */
    static final int RECENT = 256;

    /** The slot of {@link Table#recent} for these {@code count} key numbers. */
    static int slot(int[] numbers, int count) {
        if (count == 0) {
            return 0;
        }
        int h = count * 0x9E3779B9 + numbers[0] * 31 + numbers[count - 1];
        return (h ^ (h >>> 16)) & (RECENT - 1);
    }

    static RaiseException malformed(Ruby runtime, String what) {
        IRubyObject error = runtime.getModule("PuppetKicker").getConstantAt("Error");
        RubyClass errorClass = error instanceof RubyClass ? (RubyClass) error : runtime.getRuntimeError();
        return runtime.newRaiseException(errorClass, "puppet-kicker: a malformed pk_fetch reply (" + what + ")");
    }

    /** One reply being read. */
    private static final class Reading {
        private final ThreadContext context;
        private final Ruby runtime;
        /** The reply, in native memory. */
        private final MemoryIO reply;
        /** Bytes readable at {@code reply}: the reply's length, as pk_fetch handed it over. */
        private final long readable;
        private final Table table;
        /** Where the table's objects end when this reply's are added. */
        private long limit;
        /** A Hash's key numbers (scratch, grown as needed). */
        private int[] keyNumbers = new int[256];
        private final Keys probe = new Keys(keyNumbers, 0);

        Reading(ThreadContext context, MemoryIO reply, long readable, Table table) {
            this.context = context;
            this.runtime = context.runtime;
            this.reply = reply;
            this.readable = readable;
            this.table = table;
        }

        /** The u32 at byte {@code at} (below the checked length: callers check). */
        private int u32(long at) {
            return reply.getInt(at);
        }

        /** A count or length of the header: below 2^31 (a reply is far smaller). */
        private long field(int index) {
            long value = Integer.toUnsignedLong(u32(8 + 4L * index));
            if (value > Integer.MAX_VALUE) {
                throw malformed(runtime, "header field " + index);
            }
            return value;
        }

        IRubyObject servers() {
            if (readable < HEADER_BYTES) {
                throw malformed(runtime, "its length");
            }
            long total = reply.getLong(0);
            long status = field(0), base = field(1), strings = field(2), scalars = field(3);
            long containers = field(4), servers = field(5), wordCount = field(6);
            long textBytes = field(7), jsonBytes = field(8);
            long wordsAt = HEADER_BYTES;
            long textAt = wordsAt + 4 * wordCount;
            long jsonAt = textAt + textBytes;
            if (jsonAt + jsonBytes != total || total != readable) {
                throw malformed(runtime, "its length");
            }
            if (status != OK) {
                throw malformed(runtime, "status " + status + " is not OK");
            }
            // The session started over (a reply this table missed): so does the table.
            if (base != table.size) {
                table.clear();
            }
            if (base != table.size) {
                throw malformed(runtime, "base " + base + " for a table of " + table.size);
            }
            long newObjects = strings + scalars + containers;
            if (newObjects > wordCount + jsonBytes || strings > wordCount || base + newObjects > Integer.MAX_VALUE - 8) {
                throw malformed(runtime, "its counts");
            }
            table.reserve(newObjects);
            limit = base + newObjects;

            long at = 0;
            // The strings share one copy of the text (slices, frozen: never copied again).
            byte[] text = new byte[(int) textBytes];
            reply.get(textAt, text, 0, text.length);
            int offset = 0;
            for (long i = 0; i < strings; i++) {
                long stringLength = Integer.toUnsignedLong(u32(wordsAt + 4 * at++));
                if (stringLength > text.length - offset) {
                    throw malformed(runtime, "its strings");
                }
                ByteList slice = new ByteList(text, offset, (int) stringLength, UTF8Encoding.INSTANCE, false);
                RubyString string = RubyString.newStringShared(runtime, slice);
                string.setFrozen(true);
                add(string);
                offset += (int) stringLength;
            }
            if (scalars > 0) {
                byte[] json = new byte[(int) jsonBytes];
                reply.get(jsonAt, json, 0, json.length);
                new Scalars(this, json).read();
            }
            if (table.size != base + strings + scalars) {
                throw malformed(runtime, "its scalars");
            }
            for (long i = 0; i < containers; i++) {
                if (at + 2 > wordCount) {
                    throw malformed(runtime, "its words");
                }
                long tag = Integer.toUnsignedLong(u32(wordsAt + 4 * at));
                long count = Integer.toUnsignedLong(u32(wordsAt + 4 * (at + 1)));
                at += 2;
                long words = tag == OBJECT ? 2 * count : count;
                if ((tag != OBJECT && tag != ARRAY) || at + words > wordCount) {
                    throw malformed(runtime, "its words");
                }
                if (tag == OBJECT) {
                    add(hash(wordsAt + 4 * at, (int) count));
                    at += 2 * count;
                } else {
                    IRubyObject[] items = new IRubyObject[(int) count];
                    for (int item = 0; item < count; item++) {
                        items[item] = object(u32(wordsAt + 4 * at++));
                    }
                    RubyArray<?> array = RubyArray.newArrayNoCopy(runtime, items);
                    array.setFrozen(true);
                    add(array);
                }
            }
            if (at + servers != wordCount || table.size != limit) {
                throw malformed(runtime, "its words");
            }
            IRubyObject[] found = new IRubyObject[(int) servers];
            for (int server = 0; server < servers; server++) {
                found[server] = object(u32(wordsAt + 4 * at++));
            }
            return RubyArray.newArrayNoCopy(runtime, found);
        }

        /**
         * A frozen Hash of the {@code count} pairs of numbers at byte {@code from}: a copy
         * of this table's template for these keys, its values set to these first (one
         * pass over new memory, not a copy and then a pass to set values). Keys not seen
         * before get a template, made by insertion.
         */
        private RubyHash hash(long from, int count) {
            if (count > keyNumbers.length) {
                int room = Math.max(count, 2 * keyNumbers.length);
                keyNumbers = new int[room];
            }
            for (int pair = 0; pair < count; pair++) {
                keyNumbers[pair] = number(u32(from + 8L * pair));
            }
            // Objects of one shape come in runs (servers, their interfaces, ...): the
            // template last used for keys like these is checked first, without hashing.
            int slot = slot(keyNumbers, count);
            Template template = table.recent[slot];
            if (template == null || !template.hasKeys(keyNumbers, count)) {
                probe.set(keyNumbers, count);
                template = table.templates.get(probe);
            }
            if (template != null) {
                // Its entries, in the keys' order, take this Hash's values.
                RubyHashEntry[] entries = template.entries;
                for (int pair = 0; pair < count; pair++) {
                    entries[pair].setValue(object(u32(from + 8L * pair + 4)));
                }
            } else {
                RubyHash hash = new RubyHash(runtime, Math.max(count, 1));
                for (int pair = 0; pair < count; pair++) {
                    hash.fastASetCheckString(runtime, table.objects[keyNumbers[pair]], object(u32(from + 8L * pair + 4)));
                }
                Keys keys = probe.kept();
                template = Template.of(keys, hash);
                if (template == null) {
                    // Empty, or a key twice: no template; the Hash as insertion left it.
                    hash.setFrozen(true);
                    return hash;
                }
                table.templates.put(keys, template);
            }
            table.recent[slot] = template;
            RubyHash copy = template.hash.dupFast(context);
            copy.setFrozen(true);
            return copy;
        }

        void add(IRubyObject object) {
            if (table.size >= limit) {
                throw malformed(runtime, "its counts");
            }
            table.objects[table.size++] = object;
        }

        /** The object numbered {@code number}: in the table, or made by this reply. */
        private IRubyObject object(int number) {
            return table.objects[number(number)];
        }

        /** {@code number}, checked: an object the table holds. */
        private int number(int number) {
            long index = Integer.toUnsignedLong(number);
            if (index < table.size) {
                return (int) index;
            }
            throw malformed(runtime, "object " + index + " of " + table.size);
        }
    }

    /**
     * The reply's JSON array of scalars (numbers, true, false, null), as Ruby's
     * JSON.parse reads it: an integer that fits 64 bits a Fixnum, a larger one a
     * Bignum, one with a fraction or an exponent a Float.
     */
    private static final class Scalars {
        private final Reading reading;
        private final byte[] bytes;
        private final int start;
        private int at;
        private final int end;

        Scalars(Reading reading, byte[] json) {
            this.reading = reading;
            this.bytes = json;
            this.start = 0;
            this.at = 0;
            this.end = json.length;
        }

        void read() {
            expect('[');
            space();
            if (peek() == ']') {
                at++;
            } else {
                while (true) {
                    space();
                    reading.add(scalar());
                    space();
                    int next = take();
                    if (next == ']') {
                        break;
                    }
                    if (next != ',') {
                        throw bad();
                    }
                }
            }
            space();
            if (at != end) {
                throw bad();
            }
        }

        private IRubyObject scalar() {
            Ruby runtime = reading.runtime;
            if (word("null")) {
                return runtime.getNil();
            }
            if (word("true")) {
                return runtime.getTrue();
            }
            if (word("false")) {
                return runtime.getFalse();
            }
            int from = at;
            boolean integer = true;
            if (peek() == '-') {
                at++;
            }
            int digits = digits();
            if (peek() == '.') {
                integer = false;
                at++;
                digits();
            }
            if (peek() == 'e' || peek() == 'E') {
                integer = false;
                at++;
                if (peek() == '+' || peek() == '-') {
                    at++;
                }
                digits();
            }
            String number = new String(bytes, from, at - from, StandardCharsets.US_ASCII);
            if (!integer) {
                return RubyFloat.newFloat(runtime, Double.parseDouble(number));
            }
            if (digits < 19) {
                return RubyFixnum.newFixnum(runtime, Long.parseLong(number));
            }
            return RubyBignum.bignorm(runtime, new BigInteger(number));
        }

        /** Skips a run of at least one digit; its length. */
        private int digits() {
            int from = at;
            while (at < end && bytes[at] >= '0' && bytes[at] <= '9') {
                at++;
            }
            if (at == from) {
                throw bad();
            }
            return at - from;
        }

        private boolean word(String word) {
            int length = word.length();
            if (end - at < length) {
                return false;
            }
            for (int i = 0; i < length; i++) {
                if (bytes[at + i] != word.charAt(i)) {
                    return false;
                }
            }
            at += length;
            return true;
        }

        private void space() {
            while (at < end && (bytes[at] == ' ' || bytes[at] == '\n' || bytes[at] == '\r' || bytes[at] == '\t')) {
                at++;
            }
        }

        private int peek() {
            return at < end ? bytes[at] : -1;
        }

        private int take() {
            return at < end ? bytes[at++] : -1;
        }

        private void expect(char c) {
            if (take() != c) {
                throw bad();
            }
        }

        private RaiseException bad() {
            return malformed(reading.runtime, "its scalars at byte " + (at - start));
        }
    }
}
