package puppetkicker;

import java.math.BigInteger;
import java.nio.ByteBuffer;
import java.nio.ByteOrder;
import java.nio.charset.StandardCharsets;
import java.util.Arrays;
import java.util.HashMap;
import java.util.Iterator;
import java.util.Map;
import org.jcodings.specific.UTF8Encoding;
import org.jruby.Ruby;
import org.jruby.RubyArray;
import org.jruby.RubyBignum;
import org.jruby.RubyClass;
import org.jruby.RubyFixnum;
import org.jruby.RubyFloat;
import org.jruby.RubyHash;
import org.jruby.RubyModule;
import org.jruby.RubyObject;
import org.jruby.RubyString;
import org.jruby.anno.JRubyMethod;
import org.jruby.exceptions.RaiseException;
import org.jruby.runtime.ThreadContext;
import org.jruby.runtime.builtin.IRubyObject;
import org.jruby.util.ByteList;

/**
 * Reads an OK {@code pk_fetch} reply (layout: ext/puppet_kicker_ffi/src/fetch.rs) into
 * the caller's table of objects, as lib/puppet_kicker/fetch_reader.rb does, object for
 * object, but in Java: under JRuby that Ruby code costs more per object than JRuby
 * itself takes to build the object (a Hash through {@code Hash[*values_at(...)]} is
 * four Arrays and a splat). Strings are slices of one copy of the reply's text, the
 * other scalars come from its JSON array, each Hash or Array from objects already in
 * the table; all frozen. Every count and number is checked against the reply's
 * length and the table's size: a malformed reply raises {@code PuppetKicker::Error}.
 *
 * <p>Loaded by lib/puppet_kicker/ffi_backend.rb under JRuby, from
 * native/puppet_kicker_jruby.jar, which {@code rake compile} builds. Java 11 bytecode,
 * JRuby 9.3 and 9.4 API.
 */
public final class FetchReader {
    /** The reply's header: u64 length, then nine u32. */
    static final int HEADER_BYTES = 44;
    static final int OK = 0;
    static final int OBJECT = 2;
    static final int ARRAY = 1;

    private FetchReader() {}

    /** Defines {@code PuppetKicker::JavaFetchReader.servers(reply, table)}. */
    public static void define(Ruby runtime) {
        RubyModule kicker = runtime.defineModule("PuppetKicker");
        kicker.defineModuleUnder("JavaFetchReader").defineAnnotatedMethods(FetchReader.class);
    }

    /** A new, empty set of templates, for a new table (an Object holding a Java map). */
    @JRubyMethod(name = "templates", meta = true)
    public static IRubyObject templates(ThreadContext context, IRubyObject self) {
        RubyObject holder = new RubyObject(context.runtime, context.runtime.getObject());
        holder.dataWrapStruct(new Templates());
        return holder;
    }

    /**
     * The servers' frozen Hashes, in the order asked, of {@code reply} (the whole reply's
     * bytes, its status OK), their objects appended to {@code table}, its Hashes copied
     * from and kept in {@code templates} (made by {@link #templates} for this table).
     */
    @JRubyMethod(name = "servers", meta = true)
    public static IRubyObject servers(ThreadContext context, IRubyObject self, IRubyObject reply, IRubyObject table,
            IRubyObject templates) {
        Ruby runtime = context.runtime;
        Object kept = templates.dataGetStruct();
        if (!(reply instanceof RubyString) || !(table instanceof RubyArray) || !(kept instanceof Templates)) {
            throw malformed(runtime, "servers takes the reply's bytes, the table and its templates");
        }
        ByteList bytes = ((RubyString) reply).getByteList();
        Reading reading = new Reading(context, bytes.unsafeBytes(), bytes.begin(), bytes.realSize(), (RubyArray<?>) table,
                (Templates) kept);
        return reading.servers();
    }

    /** Template Hashes by the numbers of their keys, in order. */
    static final class Templates {
        final Map<Keys, RubyHash> byKeys = new HashMap<>();
    }

    /** A sequence of key numbers. */
    static final class Keys {
        final int[] numbers;
        final int hash;

        Keys(int[] numbers) {
            this.numbers = numbers;
            this.hash = Arrays.hashCode(numbers);
        }

        @Override
        public int hashCode() {
            return hash;
        }

        @Override
        public boolean equals(Object other) {
            return other instanceof Keys && Arrays.equals(numbers, ((Keys) other).numbers);
        }
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
        private final Templates templates;
        private final ByteBuffer reply;
        private final int start;
        private final int length;
        private final RubyArray<?> table;
        /** The objects this reply adds, numbered from the table's size before it. */
        private IRubyObject[] made;
        private int madeCount;
        private int tableSize;

        Reading(ThreadContext context, byte[] bytes, int start, int length, RubyArray<?> table, Templates templates) {
            this.context = context;
            this.runtime = context.runtime;
            this.templates = templates;
            this.reply = ByteBuffer.wrap(bytes).order(ByteOrder.nativeOrder());
            this.start = start;
            this.length = length;
            this.table = table;
        }

        private int u32(long at) {
            return reply.getInt(start + (int) at);
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
            if (length < HEADER_BYTES) {
                throw malformed(runtime, "its length");
            }
            long total = reply.getLong(start);
            long status = field(0), base = field(1), strings = field(2), scalars = field(3);
            long containers = field(4), servers = field(5), wordCount = field(6);
            long textBytes = field(7), jsonBytes = field(8);
            long wordsAt = HEADER_BYTES;
            long textAt = wordsAt + 4 * wordCount;
            long jsonAt = textAt + textBytes;
            if (jsonAt + jsonBytes != total || total != length) {
                throw malformed(runtime, "its length");
            }
            if (status != OK) {
                throw malformed(runtime, "status " + status + " is not OK");
            }
            // The session started over (a reply this table missed): so does the table.
            if (base != table.getLength()) {
                table.clear();
                templates.byKeys.clear();
            }
            if (base != table.getLength()) {
                throw malformed(runtime, "base " + base + " for a table of " + table.getLength());
            }
            tableSize = (int) base;
            long newObjects = strings + scalars + containers;
            if (newObjects > wordCount + jsonBytes || strings > wordCount) {
                throw malformed(runtime, "its counts");
            }
            made = new IRubyObject[(int) newObjects];

            long at = 0;
            // The strings share one copy of the text (slices, frozen: never copied again).
            byte[] text = Arrays.copyOfRange(reply.array(), start + (int) textAt, start + (int) jsonAt);
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
                new Scalars(this, start + (int) jsonAt, (int) jsonBytes).read();
            }
            if (madeCount != strings + scalars) {
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
            if (at + servers != wordCount) {
                throw malformed(runtime, "its words");
            }
            IRubyObject[] found = new IRubyObject[(int) servers];
            for (int server = 0; server < servers; server++) {
                found[server] = object(u32(wordsAt + 4 * at++));
            }
            table.push(Arrays.copyOf(made, madeCount));
            return RubyArray.newArrayNoCopy(runtime, found);
        }

        /** A frozen Hash of the {@code count} pairs of numbers at byte {@code from}. */
        private RubyHash hash(long from, int count) {
            int[] keyNumbers = new int[count];
            IRubyObject[] keys = new IRubyObject[count];
            IRubyObject[] values = new IRubyObject[count];
            for (int pair = 0; pair < count; pair++) {
                keyNumbers[pair] = u32(from + 8L * pair);
                keys[pair] = object(keyNumbers[pair]);
                values[pair] = object(u32(from + 8L * pair + 4));
            }
            Keys sequence = new Keys(keyNumbers);
            RubyHash template = templates.byKeys.get(sequence);
            if (template != null) {
                RubyHash copy = copy(template, keys, values);
                if (copy != null) {
                    copy.setFrozen(true);
                    return copy;
                }
            }
            RubyHash hash = new RubyHash(runtime, Math.max(count, 1));
            for (int pair = 0; pair < count; pair++) {
                hash.fastASetCheckString(runtime, keys[pair], values[pair]);
            }
            hash.setFrozen(true);
            if (template == null && hash.size() == count && count > 0) {
                templates.byKeys.put(sequence, hash);
            }
            return hash;
        }

        /** A copy of {@code template} with these values, or null if its keys are not these. */
        private RubyHash copy(RubyHash template, IRubyObject[] keys, IRubyObject[] values) {
            if (template.size() != keys.length) {
                return null;
            }
            RubyHash copy = template.dupFast(context);
            Iterator<?> entries = copy.directEntrySet().iterator();
            for (int pair = 0; pair < keys.length; pair++) {
                if (!entries.hasNext()) {
                    return null;
                }
                @SuppressWarnings("unchecked")
                Map.Entry<Object, Object> entry = (Map.Entry<Object, Object>) entries.next();
                if (entry.getKey() != keys[pair]) {
                    return null;
                }
                entry.setValue(values[pair]);
            }
            return entries.hasNext() ? null : copy;
        }

        void add(IRubyObject object) {
            if (madeCount == made.length) {
                throw malformed(runtime, "its counts");
            }
            made[madeCount++] = object;
        }

        /** The object numbered {@code number}: in the table, or made by this reply. */
        private IRubyObject object(int number) {
            long index = Integer.toUnsignedLong(number);
            if (index < tableSize) {
                return table.eltInternal((int) index);
            }
            if (index - tableSize < madeCount) {
                return made[(int) (index - tableSize)];
            }
            throw malformed(runtime, "object " + index + " of " + (tableSize + madeCount));
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

        Scalars(Reading reading, int start, int length) {
            this.reading = reading;
            this.bytes = reading.reply.array();
            this.start = start;
            this.at = start;
            this.end = start + length;
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
